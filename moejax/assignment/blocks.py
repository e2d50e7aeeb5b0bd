"""Block schedules over the tile-padded layout, and a loop grouped matmul for CPU.

On CPU the fastest dropless layout we measured is a loop over row blocks, each
block one plain matmul with its expert's weight slice read in place (no
per-tile weight gather, no E x masked FLOPs). Loop trip counts are dynamic,
so only blocks holding rows are visited: padding tiles past the last group
cost nothing.

Block schedule: each expert's rows, rounded up to the granule g =
gcd(tile, min_block) (model.moe.dropless.tile and min_block), are cut greedily
into blocks of `block_rows` = g * 2^j rows, then at most one block of each size
block_rows/2, block_rows/4, ..., g (the binary digits of the remainder).
block_rows is model.moe.dropless.block, rounded down to a g * 2^j and capped
at the buffer (the defaults and their measurements: moejax/dispatch/dropless.py).
The layout's padding rows past the granule (up to the tile) are not computed: the
loop paths' compute waste is relative to g, while the layout, and the reported
padding waste, stay at the tile that kernels need.
Large blocks keep the matmuls efficient; the small ones keep the waste
small. Every pass is one `fori_loop` over that size's blocks.

`loop_gmm` is the grouped matmul over such a schedule with a custom VJP
(d rows = loop of grad @ w^T, d w = loop of rows^T @ grad), the same
gmm/tgmm pairing as kernels/ (megablox), written as XLA loops.
"""

import functools
import math

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from moejax.assignment.layout import TileLayout


@struct.dataclass
class BlockPass:
  """`count` blocks of `rows` rows: block i covers rows [start[i], start[i] + rows)."""

  start: jax.Array  # int32 [max_blocks]
  expert: jax.Array  # int32 [max_blocks]
  count: jax.Array  # int32 []
  rows: int = struct.field(pytree_node=False)


def schedule_of(layout: TileLayout, dropless) -> tuple["BlockPass", ...]:
  """The block schedule the settings section model.moe.dropless asks for (block, min_block)."""
  return block_schedule(layout, dropless["block"], dropless["min_block"])


def granule(tile: int, min_block: int) -> int:
  """The smallest block: gcd(tile, min_block), so that it divides the tile."""
  return math.gcd(tile, min_block)


def block_sizes(unit: int, block_rows: int) -> tuple[int, ...]:
  """The largest unit * 2^j <= max(block_rows, unit), halving down to unit."""
  sizes = [unit << ((max(block_rows, unit) // unit).bit_length() - 1)]
  while sizes[-1] > unit:
    sizes.append(sizes[-1] // 2)
  return tuple(sizes)


def covered_sizes(layout: TileLayout, min_block: int) -> jax.Array:
  """Rows of each expert's group that the blocks cover: its size rounded up to the granule."""
  g = granule(layout.tile, min_block)
  return -(-layout.group_sizes // g) * g


def block_schedule(layout: TileLayout, block_rows: int, min_block: int) -> tuple[BlockPass, ...]:
  """Cut every expert's rows, rounded up to the granule, into blocks (see module doc)."""
  sizes = block_sizes(granule(layout.tile, min_block), min(block_rows, layout.num_rows))
  covered = covered_sizes(layout, min_block)
  num_experts = layout.padded_sizes.shape[0]
  experts = jnp.arange(num_experts, dtype=jnp.int32)
  big = sizes[0]
  per_expert = covered // big
  ends = jnp.cumsum(per_expert)
  max_blocks = layout.num_rows // big
  block = jnp.arange(max_blocks, dtype=jnp.int32)
  owner = jnp.minimum(jnp.searchsorted(ends, block, side="right"), num_experts - 1)
  start = layout.padded_starts[owner] + (block - (ends - per_expert)[owner]) * big
  passes = [
    BlockPass(start.astype(jnp.int32), owner.astype(jnp.int32), ends[-1].astype(jnp.int32), big)
  ]
  for size in sizes[1:]:
    present = (covered // size) % 2 == 1
    (index,) = jnp.nonzero(present, size=num_experts, fill_value=0)
    start = layout.padded_starts + covered // (2 * size) * (2 * size)
    passes.append(
      BlockPass(
        start[index].astype(jnp.int32), experts[index], jnp.sum(present, dtype=jnp.int32), size
      )
    )
  return tuple(passes)


def for_each_block(schedule, body, carry):
  """carry = body(rows, start, expert, carry) for every block, pass by pass."""
  for p in schedule:
    carry = lax.fori_loop(
      0, p.count, lambda i, c, p=p: body(p.rows, p.start[i], p.expert[i], c), carry
    )
  return carry


def _loop_matmul(rows, w, schedule, transpose_w):
  out_dim = w.shape[1] if transpose_w else w.shape[2]
  out_dtype = jnp.result_type(rows, w)

  def body(size, start, expert, out):
    w_e = w[expert].T if transpose_w else w[expert]
    y = lax.dynamic_slice_in_dim(rows, start, size) @ w_e
    return lax.dynamic_update_slice_in_dim(out, y.astype(out_dtype), start, 0)

  return for_each_block(schedule, body, jnp.zeros((rows.shape[0], out_dim), out_dtype))


def _loop_tmatmul(rows, grad, schedule, num_experts):
  def body(size, start, expert, dw):
    r = lax.dynamic_slice_in_dim(rows, start, size)
    g = lax.dynamic_slice_in_dim(grad, start, size)
    return dw.at[expert].add((r.T @ g).astype(dw.dtype))

  dw = jnp.zeros((num_experts, rows.shape[1], grad.shape[1]), jnp.result_type(rows, grad))
  return for_each_block(schedule, body, dw)


@jax.custom_vjp
def loop_gmm(rows, w, schedule):
  """out[block] = rows[block] @ w[expert of block]; rows outside every block -> 0."""
  return _loop_matmul(rows, w, schedule, False)


def _loop_gmm_fwd(rows, w, schedule):
  return _loop_matmul(rows, w, schedule, False), (rows, w, schedule)


def _loop_gmm_bwd(res, grad):
  rows, w, schedule = res
  d_rows = _loop_matmul(grad, w, schedule, True).astype(rows.dtype)
  d_w = _loop_tmatmul(rows, grad, schedule, w.shape[0]).astype(w.dtype)
  return d_rows, d_w, jax.tree.map(lambda _: None, schedule)


loop_gmm.defvjp(_loop_gmm_fwd, _loop_gmm_bwd)


def loop_matmul_fn(schedule):
  """The `matmul(rows, w)` an expert function calls, over this schedule."""
  return functools.partial(_apply_loop_gmm, schedule)


def _apply_loop_gmm(schedule, rows, w):
  return loop_gmm(jnp.asarray(rows), jnp.asarray(w), schedule)
