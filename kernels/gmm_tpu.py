"""Pallas Mosaic-TPU grouped matmul kernels (designed for TPU; NOT run on TPU here).

Design follows megablox (jax/experimental/pallas/ops/tpu/megablox): the row
dimension of the grid walks an ordered list of (group, row tile) work items
(``gmm_metadata.row_tile_schedule``) delivered through scalar prefetch, so the
BlockSpec index maps can pick the expert's weight block and the lhs row tile
per grid step. Items are ordered by group; within a kernel the output block
key (row tile for gmm, group for tgmm) therefore changes only between
consecutive runs of items, and a VMEM float32 accumulator is zeroed at the
first item of a run and stored at the last one. This is the standard TPU
"revisit the output block on consecutive steps" accumulation pattern.

Everything platform specific (grid spec, BlockSpecs, dimension semantics) is
in the two ``pallas_call`` set-ups below; the per-step math is
``gmm_tiles.masked_tile_dot`` / ``masked_tile_tdot``. Verified only in
``interpret=True`` mode on CPU.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from . import gmm_metadata
from . import gmm_tiles


def _run_boundaries(key_ref, i, num_slots: int):
  """Is slot ``i`` the first / last of a run of equal ``key_ref`` values?"""
  key = key_ref[i]
  first = (i == 0) | (key != key_ref[jnp.maximum(i - 1, 0)])
  last = (i == num_slots - 1) | (key != key_ref[jnp.minimum(i + 1, num_slots - 1)])
  return first, last


def _compiler_params(interpret, dimension_semantics):
  """Mosaic compiler params; the work-item axis must run sequentially."""
  if interpret:
    return None
  return pltpu.CompilerParams(dimension_semantics=dimension_semantics)


def gmm_tpu(lhs, rhs, offsets, *, tiling, out_dtype, transpose_rhs, interpret):
  """out[rows of g] = lhs[rows of g] @ rhs[g]; padding rows are written as 0.

  Shapes are already padded: lhs [m, k], rhs [E, k, n] (or [E, n, k] when
  ``transpose_rhs``), m % tm == k % tk == n % tn == 0. Grid is
  (n tiles, work items, k tiles); k innermost so the accumulator for one
  (row tile, n tile) output block stays resident.
  """
  tm, tk, tn = tiling
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  tiles_k = k // tk
  schedule = gmm_metadata.row_tile_schedule(
    offsets, padded_rows=m, tm=tm, visit_empty_groups=False, cover_padding_rows=True
  )
  num_slots = schedule.item_group.shape[0]

  def kernel(offsets_ref, group_ref, tile_ref, num_items_ref, lhs_ref, rhs_ref, out_ref, acc_ref):
    i, kk = pl.program_id(1), pl.program_id(2)
    first, last = _run_boundaries(tile_ref, i, num_slots)
    group = group_ref[i]

    @pl.when(first & (kk == 0))
    def _zero():
      acc_ref[...] = jnp.zeros_like(acc_ref)

    # Pseudo group `num_groups` covers padding rows: nothing to add there.
    @pl.when((i < num_items_ref[0]) & (group < num_groups))
    def _accumulate():
      in_group = gmm_tiles.rows_in_group(
        (tm, tk), tile_ref[i] * tm, offsets_ref[group], offsets_ref[group + 1]
      )
      acc_ref[...] += gmm_tiles.masked_tile_dot(
        lhs_ref[...], rhs_ref[...], in_group, transpose_w=transpose_rhs
      )

    @pl.when(last & (kk == tiles_k - 1))
    def _store():
      out_ref[...] = acc_ref[...].astype(out_ref.dtype)

  def rhs_block(j, i, kk, offsets, group, tile, num_items):
    expert = jnp.minimum(group[i], num_groups - 1)
    return (expert, j, kk) if transpose_rhs else (expert, kk, j)

  rhs_tile = (tn, tk) if transpose_rhs else (tk, tn)
  grid_spec = pltpu.PrefetchScalarGridSpec(
    num_scalar_prefetch=4,
    grid=(n // tn, num_slots, tiles_k),
    in_specs=[
      pl.BlockSpec((tm, tk), lambda j, i, kk, o, g, t, c: (t[i], kk)),
      pl.BlockSpec((None, *rhs_tile), rhs_block),
    ],
    out_specs=pl.BlockSpec((tm, tn), lambda j, i, kk, o, g, t, c: (t[i], j)),
    scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
  )
  return pl.pallas_call(
    kernel,
    grid_spec=grid_spec,
    out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
    compiler_params=_compiler_params(interpret, ("parallel", "arbitrary", "arbitrary")),
    interpret=interpret,
    name="gmm_tpu",
  )(schedule.offsets, schedule.item_group, schedule.item_tile, schedule.num_items[None], lhs, rhs)


def tgmm_tpu(lhs, grad, offsets, *, num_groups, tiling, out_dtype, interpret):
  """out[g] = lhs[rows of g]^T @ grad[rows of g]; empty groups give zeros.

  Shapes are already padded: lhs [m, k], grad [m, n]. Grid is
  (k tiles, n tiles, work items); items innermost so each group's [tk, tn]
  output block accumulates over the group's row tiles, and every group
  (empty ones included) has at least one item that stores its block.
  """
  tm, tk, tn = tiling
  m, k = lhs.shape
  n = grad.shape[1]
  schedule = gmm_metadata.row_tile_schedule(
    offsets, padded_rows=m, tm=tm, visit_empty_groups=True, cover_padding_rows=False
  )
  num_slots = schedule.item_group.shape[0]

  def kernel(offsets_ref, group_ref, tile_ref, num_items_ref, lhs_ref, grad_ref, out_ref, acc_ref):
    i = pl.program_id(2)
    first, last = _run_boundaries(group_ref, i, num_slots)
    group = group_ref[i]

    @pl.when(first)
    def _zero():
      acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(i < num_items_ref[0])
    def _accumulate():
      in_group = gmm_tiles.rows_in_group(
        (tm, tk), tile_ref[i] * tm, offsets_ref[group], offsets_ref[group + 1]
      )
      acc_ref[...] += gmm_tiles.masked_tile_tdot(lhs_ref[...], grad_ref[...], in_group)

    @pl.when(last)
    def _store():
      out_ref[...] = acc_ref[...].astype(out_ref.dtype)

  grid_spec = pltpu.PrefetchScalarGridSpec(
    num_scalar_prefetch=4,
    grid=(k // tk, n // tn, num_slots),
    in_specs=[
      pl.BlockSpec((tm, tk), lambda kk, j, i, o, g, t, c: (t[i], kk)),
      pl.BlockSpec((tm, tn), lambda kk, j, i, o, g, t, c: (t[i], j)),
    ],
    out_specs=pl.BlockSpec((None, tk, tn), lambda kk, j, i, o, g, t, c: (g[i], kk, j)),
    scratch_shapes=[pltpu.VMEM((tk, tn), jnp.float32)],
  )
  return pl.pallas_call(
    kernel,
    grid_spec=grid_spec,
    out_shape=jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
    compiler_params=_compiler_params(interpret, ("parallel", "parallel", "arbitrary")),
    interpret=interpret,
    name="tgmm_tpu",
  )(schedule.offsets, schedule.item_group, schedule.item_tile, schedule.num_items[None], lhs, grad)
