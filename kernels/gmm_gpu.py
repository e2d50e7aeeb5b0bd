"""Pallas Triton (GPU) grouped matmul kernels (designed for GPU; NOT run on GPU here).

GPU grid programs run in parallel, so the TPU trick of revisiting one output
block on consecutive grid steps is unavailable. Instead each program owns one
output block and loops over what contributes to it, in the spirit of the
SonicMoE / Triton grouped-GEMM kernels:

* gmm: program (row tile t, column tile j) loops over the groups touching
  tile t (``gmm_metadata.tile_group_ranges``) and, per group, over k tiles,
  adding ``masked(lhs tile) @ rhs[g] tile`` into one float32 accumulator.
  Rows in no group (padding) are masked by every group and come out as 0.
* tgmm: program (group g, k tile, n tile) loops over the row tiles of group g
  (``gmm_metadata.group_tile_ranges``); empty groups loop zero times and store
  zeros.

Inputs are whole-array refs sliced with ``pl.ds``; all slice sizes are the
(power-of-two) tile sizes as Triton requires. Real Triton also needs every
tile >= 16 for ``tl.dot``; ``check_gpu_tiling`` enforces that when compiling
(interpret mode accepts the 8-row tiles the CPU tests use).
Platform specifics are ``_compiler_params`` and the BlockSpecs. Verified only
in ``interpret=True`` mode on CPU.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from . import gmm_metadata
from . import gmm_tiles

MIN_TRITON_DOT_TILE = 16


def check_gpu_tiling(tiling) -> None:
  """Raise ValueError for tiles Triton cannot compile (interpret mode is lax)."""
  bad = [t for t in tiling if t < MIN_TRITON_DOT_TILE or t != gmm_tiles.next_power_of_2(t)]
  if bad:
    raise ValueError(
      f"Triton gmm needs power-of-two tiles >= {MIN_TRITON_DOT_TILE}, got "
      f"effective tiling {tuple(tiling)}; pick other tiles or interpret=True"
    )


# Triton keeps NUM_STAGES copies of both operand tiles in shared memory. An
# H200 offers 232,448 bytes per block (the f32 (128, 128, 128) tiling asked for
# 262,144 there and failed to compile); 160 KiB also fits an A100's 164 KiB.
NUM_STAGES = 2
SHARED_MEMORY_BUDGET = 160 * 1024


def fit_shared_memory(tiling, itemsize: int, contraction_axis: int) -> tuple[int, int, int]:
  """Halve the contracted tile until both operand tiles fit SHARED_MEMORY_BUDGET.

  gmm contracts over tk (axis 1: tiles [tm, tk] and [tk, tn]); tgmm over tm
  (axis 0: tiles [tm, tk] and [tm, tn]). Stops at MIN_TRITON_DOT_TILE.
  """
  tiling = list(tiling)

  def operand_bytes(t):
    a, b, c = t
    other = a * c if contraction_axis == 0 else b * c
    return (a * b + other) * itemsize * NUM_STAGES

  while (
    operand_bytes(tiling) > SHARED_MEMORY_BUDGET and tiling[contraction_axis] > MIN_TRITON_DOT_TILE
  ):
    tiling[contraction_axis] //= 2
  return tuple(tiling)


def _compiler_params(interpret):
  if interpret:
    return None
  return plgpu.CompilerParams(num_warps=4, num_stages=NUM_STAGES)


def gmm_gpu(lhs, rhs, offsets, *, tiling, out_dtype, transpose_rhs, interpret):
  """out[rows of g] = lhs[rows of g] @ rhs[g]; padding rows are 0.

  Shapes are already padded: lhs [m, k], rhs [E, k, n] (or [E, n, k] when
  ``transpose_rhs``), m % tm == k % tk == n % tn == 0.
  """
  tm, tk, tn = tiling
  m, k = lhs.shape
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  tiles_m, tiles_k = m // tm, k // tk
  group_lo, group_hi = gmm_metadata.tile_group_ranges(offsets, num_tiles=tiles_m, tm=tm)

  def kernel(offsets_ref, group_lo_ref, group_hi_ref, lhs_ref, rhs_ref, out_ref):
    t, j = pl.program_id(0), pl.program_id(1)
    first_row = pl.multiple_of(t * tm, tm)
    first_col = pl.multiple_of(j * tn, tn)

    def add_group(group, acc):
      start, end = offsets_ref[group], offsets_ref[group + 1]
      in_group = gmm_tiles.rows_in_group((tm, tk), first_row, start, end)

      def add_k_tile(kt, acc):
        first_k = pl.multiple_of(kt * tk, tk)
        x = lhs_ref[pl.ds(first_row, tm), pl.ds(first_k, tk)]
        if transpose_rhs:
          w = rhs_ref[group, pl.ds(first_col, tn), pl.ds(first_k, tk)]
        else:
          w = rhs_ref[group, pl.ds(first_k, tk), pl.ds(first_col, tn)]
        return acc + gmm_tiles.masked_tile_dot(x, w, in_group, transpose_w=transpose_rhs)

      # A static k loop inside a cond that skips empty groups. A traced trip count
      # (fori_loop(0, where(end > start, tiles_k, 0))) failed to compile on an H200
      # (jax 0.11.2: "'scf.for' op failed to verify that all of {lowerBound,
      # upperBound, step} have same type").
      return jax.lax.cond(
        end > start,
        lambda acc: jax.lax.fori_loop(0, tiles_k, add_k_tile, acc),
        lambda acc: acc,
        acc,
      )

    acc = jax.lax.fori_loop(
      group_lo_ref[t], group_hi_ref[t], add_group, jnp.zeros((tm, tn), jnp.float32)
    )
    out_ref[...] = acc.astype(out_ref.dtype)

  whole = pl.no_block_spec
  return pl.pallas_call(
    kernel,
    grid=(tiles_m, n // tn),
    in_specs=[whole] * 5,
    out_specs=pl.BlockSpec((tm, tn), lambda t, j: (t, j)),
    out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
    compiler_params=_compiler_params(interpret),
    interpret=interpret,
    name="gmm_gpu",
  )(offsets, group_lo, group_hi, lhs, rhs)


def tgmm_gpu(lhs, grad, offsets, *, num_groups, tiling, out_dtype, interpret):
  """out[g] = lhs[rows of g]^T @ grad[rows of g]; empty groups give zeros.

  Shapes are already padded: lhs [m, k], grad [m, n].
  """
  tm, tk, tn = tiling
  k = lhs.shape[1]
  n = grad.shape[1]
  tile_lo, tile_hi = gmm_metadata.group_tile_ranges(offsets, tm=tm)

  def kernel(offsets_ref, tile_lo_ref, tile_hi_ref, lhs_ref, grad_ref, out_ref):
    group, kt, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    first_k = pl.multiple_of(kt * tk, tk)
    first_col = pl.multiple_of(j * tn, tn)
    start, end = offsets_ref[group], offsets_ref[group + 1]

    def add_row_tile(t, acc):
      first_row = pl.multiple_of(t * tm, tm)
      in_group = gmm_tiles.rows_in_group((tm, tk), first_row, start, end)
      x = lhs_ref[pl.ds(first_row, tm), pl.ds(first_k, tk)]
      dy = grad_ref[pl.ds(first_row, tm), pl.ds(first_col, tn)]
      return acc + gmm_tiles.masked_tile_tdot(x, dy, in_group)

    acc = jax.lax.fori_loop(
      tile_lo_ref[group], tile_hi_ref[group], add_row_tile, jnp.zeros((tk, tn), jnp.float32)
    )
    out_ref[...] = acc.astype(out_ref.dtype)

  whole = pl.no_block_spec
  return pl.pallas_call(
    kernel,
    grid=(num_groups, k // tk, n // tn),
    in_specs=[whole] * 5,
    out_specs=pl.BlockSpec((None, tk, tn), lambda g, kt, j: (g, kt, j)),
    out_shape=jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
    compiler_params=_compiler_params(interpret),
    interpret=interpret,
    name="tgmm_gpu",
  )(offsets, tile_lo, tile_hi, lhs, grad)
