"""`model.moe.grouped_matmul`: how dropless dispatch applies the experts to rows
grouped by expert. The one registry of these choices: dispatch
(dropless.py), config validation (model.moe.grouped_matmul and
model.omni.grouped_matmul) and the contract tests all read it.

An entry (`GroupedMatmulSpec`) is one of
  a matmul   make(layout, cfg) -> matmul(rows [R, a], w [E, a, b]) -> [R, b]
             over the tile-padded row buffer (base.TileLayout): the rows of
             expert e times w[e]; padding rows give anything (they carry
             weight 0). The expert type's `apply` runs against it.
  fused      no matmul: dispatch runs the expert type's own fused path
             (ConfigError if the type declares none).
  per_token  no layout: dispatch gives every (token, slot) its own row and the
             matmul gathers each row's expert slice (token_gather.py).
  an alias   resolve(experts, few_rows) -> the name of another entry, for this
             platform, expert type (`experts`: BoundExperts, or None for a plain
             expert function) and call (few_rows: no more (token, slot)
             assignments than experts).
An entry may also declare its settings section (registry.PartSettings, e.g.
model.moe.gmm), built by config.base_config and validated with every config.

Registered:
  'fused'       the expert type's fused path (SwiGLU: the SonicMoE block loop
                of experts/swiglu_memeff.py, the same as dispatch 'dropless_memeff'; atomic:
                the naive gather). Fastest on CPU, least memory.
  'loop'        a fori_loop over row blocks (assignment/blocks.py): each block one plain
                matmul against its expert's weight slice, read in place; only
                blocks holding rows are visited. Exact FLOPs up to padding.
                Blocks: model.moe.dropless.block and min_block (dropless.py).
                The fastest path on CPU for any expert function.
  'tiled'       one batched einsum over all tiles, each tile times its expert's
                weight slice gathered per tile (a [tiles, a, b] weight copy per
                matmul; computes the unused tiles too).
  'ragged_dot'  jax.lax.ragged_dot on the padded groups (portable; on CPU it
                lowers to a masked dense dot over all groups, E x the FLOPs).
  'gmm'         the Pallas grouped-matmul kernel (moejax.kernels), backend
                model.moe.gmm.backend (kernels.BACKENDS; 'auto': the TPU or GPU
                kernel, on CPU the kernel's jnp reference, E x the FLOPs).
  'gather'      no sort, no layout: each (token, slot) row times its own expert's
                weight slice, gathered (token_gather.py). One weight copy per
                row: for a handful of rows (decode steps), not for training.
  'auto'        'gather' on any platform when a call has no more (token, slot)
                assignments than experts (a decode step); else 'gmm' on TPU/GPU,
                and on CPU 'fused' for expert types with a fused path, else 'loop'
                (measured: docs/results/moe_layer_*_cpu.md, generate_cpu.md).
'fused', 'loop' and 'gmm' are custom VJPs: reverse-mode only (no jax.jvp /
jacfwd); force 'tiled' or 'gather' for forward-mode differentiation.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from moejax.assignment.layout import TileLayout
from moejax.assignment.blocks import loop_matmul_fn, schedule_of
from moejax.registry import PartSettings, Registry

Matmul = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class GroupedMatmulSpec:
  """A registered grouped matmul: exactly one of make, fused, per_token, resolve (module doc)."""

  name: str
  make: Callable[[TileLayout, Any], Matmul] | None = None
  fused: bool = False
  resolve: Callable[[Any, bool], str] | None = None  # (experts, few_rows) -> name
  settings: PartSettings | None = None
  per_token: bool = False

  def build(self, layout: TileLayout, cfg: Any) -> Matmul:
    """`make(layout, cfg)`; ValueError for an entry without one (fused, per-token, alias)."""
    if self.make is None:
      raise ValueError(
        f"grouped matmul {self.name!r} builds no matmul (fused, per-token or "
        "an alias: resolve_grouped_matmul first)"
      )
    return self.make(layout, cfg)

  def __post_init__(self):
    if (self.make is not None) + self.fused + self.per_token + (self.resolve is not None) != 1:
      raise ValueError(
        f"grouped matmul {self.name!r}: give exactly one of make, fused, per_token, resolve"
      )


GROUPED_MATMULS: Registry[GroupedMatmulSpec] = Registry("model.moe.grouped_matmul")


def register_grouped_matmul(
  name: str, *, make=None, fused=False, resolve=None, settings=None, per_token=False
):
  """Register a grouped matmul; as a decorator of `make` when no make/fused/per_token/resolve
  is given."""
  if make is None and not fused and resolve is None and not per_token:

    def wrap(fn):
      register_grouped_matmul(name, make=fn, settings=settings)
      return fn

    return wrap
  return GROUPED_MATMULS.add(
    name, GroupedMatmulSpec(name, make, fused, resolve, settings, per_token)
  )


def resolve_grouped_matmul(
  name: str, experts=None, *, config_key=None, few_rows: bool = False
) -> GroupedMatmulSpec:
  """The entry `name` stands for (aliases such as 'auto' followed) for these experts;
  few_rows: the call has no more (token, slot) assignments than experts."""
  seen = []
  while True:
    if name not in GROUPED_MATMULS and config_key is not None:
      from moejax.errors import choice_error

      raise choice_error(config_key, name, GROUPED_MATMULS)
    spec = GROUPED_MATMULS.get(name)
    if spec.resolve is None:
      return spec
    seen.append(name)
    name = spec.resolve(experts, few_rows)
    if name in seen:
      raise ValueError(f"grouped matmul aliases loop: {seen + [name]}")


def tiled_matmul(tile_expert, tile, rows, w):
  """rows [n_tiles * tile, a] @ w[tile_expert[j]] for each tile j -> [n_tiles * tile, b]."""
  a = rows.shape[-1]
  out = jnp.einsum("tra,tab->trb", rows.reshape(-1, tile, a), w[tile_expert])
  return out.reshape(-1, w.shape[-1])


@register_grouped_matmul("loop")
def make_loop(layout, cfg):
  return loop_matmul_fn(schedule_of(layout, cfg.dropless))


@register_grouped_matmul("tiled")
def make_tiled(layout, cfg):
  return functools.partial(tiled_matmul, layout.tile_expert(), layout.tile)


@register_grouped_matmul("ragged_dot")
def make_ragged_dot(layout, cfg):
  return lambda rows, w: jax.lax.ragged_dot(rows, w, layout.padded_sizes)


def validate_gmm(cfg) -> None:
  """model.moe.gmm.backend is one of kernels.BACKENDS."""
  from moejax.kernels import BACKENDS
  from moejax.errors import choice_error

  backend = GMM.parse(cfg)["backend"]
  if backend not in BACKENDS:
    raise choice_error("model.moe.gmm.backend", backend, BACKENDS)


# model.moe.gmm: the kernel backend (kernels.BACKENDS).
GMM = PartSettings(
  "gmm",
  "grouped matmul 'gmm'",
  (("backend", "auto"),),
  legacy_keys=(("gmm_backend", "backend"),),
  validate=validate_gmm,
)


@register_grouped_matmul("gmm", settings=GMM)
def make_gmm(layout, cfg):
  from moejax.kernels import gmm  # Pallas: imported only when used

  backend = GMM.parse(cfg)["backend"]
  return lambda rows, w: gmm(rows, w, layout.padded_sizes, backend=backend)


register_grouped_matmul("fused", fused=True)
register_grouped_matmul("gather", per_token=True)


def resolve_auto(experts, few_rows: bool = False) -> str:
  if few_rows:
    return "gather"
  if jax.default_backend() != "cpu":
    return "gmm"
  return "fused" if experts is not None and experts.has_fused else "loop"


register_grouped_matmul("auto", resolve=resolve_auto)
