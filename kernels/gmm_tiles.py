"""Tile sizing, padding and the masked tile products shared by all gmm kernels.

Every kernel (TPU or GPU) reduces to the same inner step: take a row tile of
``lhs``, zero the rows that are not in the current group, and multiply with
one expert's weight tile, accumulating in float32. Masking the operand rather
than the result lets all groups touching a tile share one accumulator.
"""

import jax
import jax.numpy as jnp

# Floor for automatically shrunk tiles: Triton's tl.dot needs every dim >= 16
# and 16 rows fill a packed bf16 TPU sublane tile. Explicitly requested
# smaller tiles (e.g. 8 in interpret-mode tests) are kept.
MIN_AUTO_TILE = 16


def next_power_of_2(x: int) -> int:
  return 1 if x <= 1 else 1 << (x - 1).bit_length()


def fit_tile(tile: int, dim: int) -> int:
  """Shrink ``tile`` to the smallest power of two (>= 16) covering ``dim``.

  A tile never exceeds the (power-of-two-rounded) dimension, so tiny problems
  do not pad up to a full default tile. When the tile is clipped it equals the
  padded dimension, which satisfies the TPU "block equals full dimension"
  rule and the Triton power-of-two rule.
  """
  return min(tile, next_power_of_2(max(dim, MIN_AUTO_TILE)))


def fit_tiling(tiling, m: int, k: int, n: int) -> tuple[int, int, int]:
  return fit_tile(tiling[0], m), fit_tile(tiling[1], k), fit_tile(tiling[2], n)


def round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def pad_axes(x: jnp.ndarray, sizes: dict[int, int]) -> jnp.ndarray:
  """Zero-pad axis ``a`` of ``x`` up to ``sizes[a]`` (no-op when aligned)."""
  widths = [(0, sizes.get(a, d) - d) for a, d in enumerate(x.shape)]
  if all(hi == 0 for _, hi in widths):
    return x
  return jnp.pad(x, widths)


def rows_in_group(tile_shape, first_row, group_start, group_end) -> jnp.ndarray:
  """Boolean [tile_shape] mask: row ``first_row + r`` lies in the group."""
  rows = first_row + jax.lax.broadcasted_iota(jnp.int32, tile_shape, 0)
  return (rows >= group_start) & (rows < group_end)


def masked_tile_dot(x, w, in_group, *, transpose_w: bool) -> jnp.ndarray:
  """float32 ``where(in_group, x, 0) @ w`` for x [tm, tk], w [tk, tn] (or [tn, tk])."""
  x = jnp.where(in_group, x, jnp.zeros_like(x))
  contract_w = 1 if transpose_w else 0
  return jax.lax.dot_general(
    x, w, (((1,), (contract_w,)), ((), ())), preferred_element_type=jnp.float32
  )


def masked_tile_tdot(x, dy, in_group) -> jnp.ndarray:
  """float32 ``where(in_group, x, 0).T @ dy`` for x [tm, tk], dy [tm, tn]."""
  x = jnp.where(in_group, x, jnp.zeros_like(x))
  return jax.lax.dot_general(x, dy, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
