"""Dropless dispatch (MegaBlocks, Gale et al. 2022): sort rows by expert, no capacity.

Layout: assignments are sorted by expert and each expert's group of rows is
padded with zero rows to a multiple of `tile` rows, so every tile of `tile`
rows belongs to exactly one expert (tile = 1: no padding). The buffer has a
static size, ceil(T*S / tile) + E tiles, enough for any routing. Padding waste
(padded rows / real rows - 1) is reported as a metric. Invalid slots sort to
the end and cost nothing.

The grouped matmul over that layout is `model.moe.grouped_matmul`:
  'tiled'       one batched matmul over tiles, each tile times its expert's
                weight slice (gathered per tile). Exact FLOPs up to padding;
                the fastest path on CPU here (see experiments/benchmarks).
  'ragged_dot'  jax.lax.ragged_dot on the padded groups (portable; on CPU it
                lowers to a masked dense dot over all groups, E x the FLOPs).
  'gmm'         the Pallas grouped-matmul kernel from kernels/ (TPU, GPU);
                on CPU it runs the kernel's jnp reference.
  'auto'        'gmm' on TPU/GPU, 'tiled' on CPU.
"""
import functools
import math

import jax
import jax.numpy as jnp

from moejax.dispatch.base import combine, register_dispatcher, sort_by_expert
from moejax.errors import choice_error

GROUPED_MATMULS = ("auto", "tiled", "ragged_dot", "gmm")


def get_grouped_matmul(name: str) -> str:
  if name not in GROUPED_MATMULS:
    raise choice_error("model.moe.grouped_matmul", name, GROUPED_MATMULS)
  if name == "auto":
    return "tiled" if jax.default_backend() == "cpu" else "gmm"
  return name


def tiled_matmul(tile_expert, tile, rows, w):
  """rows [n_tiles * tile, a] @ w[tile_expert[j]] for each tile j -> [n_tiles * tile, b]."""
  a = rows.shape[-1]
  out = jnp.einsum("tra,tab->trb", rows.reshape(-1, tile, a), w[tile_expert])
  return out.reshape(-1, w.shape[-1])


def make_matmul(name, group_sizes_padded, tile_expert, tile):
  if name == "tiled":
    return functools.partial(tiled_matmul, tile_expert, tile)
  if name == "ragged_dot":
    return lambda rows, w: jax.lax.ragged_dot(rows, w, group_sizes_padded)
  from kernels import gmm
  return lambda rows, w: gmm(rows, w, group_sizes_padded)


@register_dispatcher("dropless")
def dispatch_dropless(x, routing, expert_fn, cfg):
  num_experts = cfg.num_experts
  method = get_grouped_matmul(cfg.grouped_matmul)
  tile = cfg.dropless_tile
  sorted_ = sort_by_expert(routing, num_experts)
  num_assign = sorted_.order.shape[0]
  num_tiles = math.ceil(num_assign / tile) + num_experts
  padded_sizes = -(-sorted_.group_sizes // tile) * tile
  padded_ends = jnp.cumsum(padded_sizes)
  padded_starts = padded_ends - padded_sizes
  is_valid = sorted_.expert < num_experts
  # Row of each sorted assignment in the padded buffer; invalid ones fall off the end.
  dest = jnp.where(is_valid, padded_starts[jnp.minimum(sorted_.expert, num_experts - 1)]
                   + sorted_.position, num_tiles * tile)
  rows = jnp.zeros((num_tiles * tile, x.shape[-1]), x.dtype).at[dest].set(
      x[sorted_.token], mode="drop")
  tile_start = jnp.arange(num_tiles, dtype=jnp.int32) * tile
  tile_expert = jnp.minimum(jnp.searchsorted(padded_ends, tile_start, side="right"),
                            num_experts - 1).astype(jnp.int32)
  out = expert_fn(rows, make_matmul(method, padded_sizes, tile_expert, tile))
  y_sorted = out.at[dest].get(mode="fill", fill_value=0)
  real = jnp.sum(sorted_.group_sizes)
  metrics = {"dropped_fraction": jnp.zeros((), jnp.float32),
             "padding_waste": (jnp.sum(padded_sizes) - real) / jnp.maximum(real, 1)}
  return combine(y_sorted, sorted_, routing, x.dtype), metrics
