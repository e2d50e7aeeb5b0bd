"""Dropless dispatch (MegaBlocks, Gale et al. 2022): sort rows by expert, no capacity.

Layout (base.TileLayout): assignments are sorted by expert and each expert's
group of rows is padded to a multiple of `model.moe.dropless_tile` rows, so
every tile belongs to exactly one expert (tile = 1: no padding). Rows are
gathered from x by token (padding rows repeat token 0 and are never read
back); outputs are combined with a weighted scatter-add over rows. Padding
waste (padded rows / real rows) is reported relative to dropless_tile.
Invalid slots sort to the end and cost nothing.

The grouped matmul over that layout is `model.moe.grouped_matmul`:
  'fused'       SwiGLU experts only: the whole expert pass (gather, gate/up,
                SwiGLU, down, weighted scatter-add) fused into one block loop
                with the SonicMoE custom VJP; the same as dispatch
                'dropless_memeff' (memeff.py). Fastest on CPU, least memory.
  'loop'        a fori_loop over row blocks (blocks.py): each block one plain
                matmul against its expert's weight slice, read in place; only
                blocks holding rows are visited. Exact FLOPs up to padding.
                The fastest path on CPU for any expert function.
  'tiled'       one batched einsum over all tiles, each tile times its expert's
                weight slice gathered per tile (a [tiles, a, b] weight copy per
                matmul; computes the unused tiles too).
  'ragged_dot'  jax.lax.ragged_dot on the padded groups (portable; on CPU it
                lowers to a masked dense dot over all groups, E x the FLOPs).
  'gmm'         the Pallas grouped-matmul kernel from kernels/ (TPU, GPU);
                on CPU it runs the kernel's jnp reference (E x the FLOPs).
  'auto'        'gmm' on TPU/GPU; on CPU 'fused' for SwiGLU experts, else 'loop'
                (measured: docs/results/moe_layer_*_cpu.md).
'fused' and 'loop' are custom VJPs: reverse-mode only (no jax.jvp / jacfwd);
force 'tiled' for forward-mode differentiation.
"""
import functools

import jax
import jax.numpy as jnp

from moejax.dispatch.base import (combine_rows, dropless_metrics, register_dispatcher,
                                  tile_layout)
from moejax.dispatch.blocks import block_rows_of, block_schedule, loop_matmul_fn
from moejax.dispatch.memeff import dispatch_dropless_memeff
from moejax.errors import choice_error
from moejax.experts.swiglu import swiglu_weights_of

GROUPED_MATMULS = ("auto", "fused", "loop", "tiled", "ragged_dot", "gmm")


def get_grouped_matmul(name: str, expert_fn=None) -> str:
  """The grouped matmul `name` stands for ('auto' resolved for this platform and expert_fn)."""
  if name not in GROUPED_MATMULS:
    raise choice_error("model.moe.grouped_matmul", name, GROUPED_MATMULS)
  if name == "auto":
    if jax.default_backend() != "cpu":
      return "gmm"
    return "fused" if swiglu_weights_of(expert_fn) is not None else "loop"
  return name


def tiled_matmul(tile_expert, tile, rows, w):
  """rows [n_tiles * tile, a] @ w[tile_expert[j]] for each tile j -> [n_tiles * tile, b]."""
  a = rows.shape[-1]
  out = jnp.einsum("tra,tab->trb", rows.reshape(-1, tile, a), w[tile_expert])
  return out.reshape(-1, w.shape[-1])


def make_matmul(name, layout, block_rows):
  if name == "loop":
    return loop_matmul_fn(block_schedule(layout, block_rows))
  if name == "tiled":
    return functools.partial(tiled_matmul, layout.tile_expert(), layout.tile)
  if name == "ragged_dot":
    return lambda rows, w: jax.lax.ragged_dot(rows, w, layout.padded_sizes)
  from moejax.kernels import gmm
  return lambda rows, w: gmm(rows, w, layout.padded_sizes)


@register_dispatcher("dropless")
def dispatch_dropless(x, routing, expert_fn, cfg):
  method = get_grouped_matmul(cfg.grouped_matmul, expert_fn)
  if method == "fused":
    return dispatch_dropless_memeff(x, routing, expert_fn, cfg)
  layout = tile_layout(routing, cfg.num_experts, cfg.dropless_tile)
  matmul = make_matmul(method, layout, block_rows_of(cfg))
  out = expert_fn(jnp.asarray(x)[layout.row_token], matmul)
  return combine_rows(out, layout, routing, x.dtype), dropless_metrics(layout)
