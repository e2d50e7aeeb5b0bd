"""Dropless dispatch (MegaBlocks, Gale et al. 2022): sort rows by expert, no capacity.

Layout (base.TileLayout): assignments are sorted by expert and each expert's
group of rows is padded to a multiple of `model.moe.dropless.tile` rows, so
every tile belongs to exactly one expert (tile = 1: no padding). Rows are
gathered from x by token (padding rows repeat token 0 and are never read
back); outputs are combined with a weighted scatter-add over rows. Padding
waste (padded rows / real rows) is reported relative to the tile.
Invalid slots sort to the end and cost nothing.

Settings, model.moe.dropless (DROPLESS; shared with dispatch 'dropless_memeff',
memeff.py, and read by the loop paths, moejax/assignment/blocks.py, and the expert
types' fused paths): `tile`, the padding unit above; `block`, rows per matmul block of
the loop paths; `min_block`, their smallest block: each expert's rows are computed
up to a multiple of gcd(tile, min_block).

The grouped matmul over that layout is `model.moe.grouped_matmul`, an entry
of the registry in grouped_matmul.py (loop, tiled, ragged_dot, gmm; 'fused':
the expert type's own fused path; 'gather': no layout at all, each (token,
slot) its own row, token_gather.py; 'auto'). Nothing here knows an expert type:
what an expert computes and whether it has a fused path is what its
registered ExpertType declares (moejax/experts/base.py).
"""

import jax.numpy as jnp

from moejax.assignment.layout import combine_rows, dropless_metrics, tile_layout
from moejax.dispatch.base import register_dispatcher
from moejax.dispatch.grouped_matmul import (
  GROUPED_MATMULS,  # noqa: F401  (re-exported)
  resolve_grouped_matmul,
)
from moejax.dispatch.memeff import dispatch_dropless_memeff
from moejax.dispatch.token_gather import token_gather_dispatch
from moejax.experts.base import experts_of
from moejax.registry import PartSettings, check_number


def validate_dropless(cfg) -> None:
  for key, value in DROPLESS.parse(cfg).items():
    check_number(f"model.moe.dropless.{key}", value, integer=True)


DROPLESS = PartSettings(
  "dropless",
  "the dropless layout (dispatch 'dropless', 'dropless_memeff')",
  (
    ("tile", 128),
    # Measured on the 2-core CPU (experiments/benchmarks/moe_layer.py): 512-row
    # blocks beat 128 and 256 at the lm, coarse and fine shapes; 1024 is no better.
    ("block", 512),
    # 128, the default tile (granule = the tile). Measured (fwd+bwd against dense, same
    # process, docs/results/moe_layer_2026-12-02_cpu.md), granule 8 / 16 / 32 / 64 /
    # 128: fine (E=64) 0.74 / 0.78 / 0.80 / 0.81 / 0.78, finer (E=128) 0.53 / 0.56 /
    # 0.57 / 0.58 / 0.55; coarse (E=8, f=1024) 32 / 64 / 128: 0.88 / 0.94 / 0.94
    # (smaller blocks each read, and in the backward update, their expert's whole
    # weights). Training the default LM (E=8, ~1024 rows per expert), 600-step runs,
    # steady-state tokens/s: 12,366 (64), 12,785 (32), 13,896 and 11,296 (128, two
    # runs): not resolved. The default keeps the tile, so that configs without
    # fine-grained experts train exactly as before; 64 is set for fine-grained ones
    # (a few hundred rows per expert: +5-8% fwd+bwd).
    ("min_block", 128),
  ),
  legacy_keys=(
    ("dropless_tile", "tile"),
    ("dropless_block", "block"),
    ("dropless_min_block", "min_block"),
  ),
  validate=validate_dropless,
)


def get_grouped_matmul(name: str, expert_fn=None) -> str:
  """The grouped matmul `name` stands for ('auto' resolved for this platform and
  expert_fn); ConfigError naming model.moe.grouped_matmul if unknown."""
  return resolve_grouped_matmul(
    name, experts_of(expert_fn), config_key="model.moe.grouped_matmul"
  ).name


@register_dispatcher("dropless", settings=DROPLESS)
def dispatch_dropless(x, routing, expert_fn, cfg):
  spec = resolve_grouped_matmul(
    cfg.grouped_matmul,
    experts_of(expert_fn),
    config_key="model.moe.grouped_matmul",
    few_rows=routing.expert_index.size <= cfg.num_experts,
  )
  if spec.fused:
    return dispatch_dropless_memeff(x, routing, expert_fn, cfg)
  if spec.per_token:
    return token_gather_dispatch(jnp.asarray(x), routing, expert_fn)
  x = jnp.asarray(x)
  layout = tile_layout(routing, cfg.num_experts, DROPLESS.parse(cfg)["tile"])
  out = expert_fn(x[layout.row_token], spec.build(layout, cfg))
  return combine_rows(out, layout, routing, x.dtype), dropless_metrics(layout)


register_dispatcher("dropless_memeff", settings=DROPLESS)(dispatch_dropless_memeff)
