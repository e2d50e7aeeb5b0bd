"""Group metadata for grouped matmul: which (row tile, group) pairs to visit.

The rows of ``lhs`` are sorted by group, so group ``g`` owns the contiguous row
range ``[offsets[g], offsets[g + 1])``. A row tile of ``tm`` rows may hold the
tail of one group and the head of the next; such a tile is visited once per
group it touches and the kernel masks the rows that are not in the group.
This is the "group metadata" idea of megablox (jax/experimental/pallas/ops/
tpu/megablox); the formulation below (searchsorted over a cumulative item
count) is our own.

Two shapes of metadata are produced:

* ``row_tile_schedule``: a flat, ordered list of work items for kernels whose
  grid walks the items sequentially (the TPU kernels). Items are ordered by
  group, hence tile ids never decrease and every output block is revisited on
  consecutive grid steps only.
* ``tile_group_ranges`` / ``group_tile_ranges``: per-tile group ranges and
  per-group tile ranges for kernels that loop inside one program (the GPU
  kernels, whose grid programs run in parallel).

All functions are traceable: ``group_sizes`` is data, all shapes are static.
"""

from typing import NamedTuple

import jax.numpy as jnp


def group_offsets(group_sizes: jnp.ndarray, num_rows: int) -> jnp.ndarray:
  """Row offsets [E + 1] of each group (CSR style), clipped to ``num_rows``.

  Rows past ``num_rows`` do not exist, so groups whose cumulative size exceeds
  ``num_rows`` are truncated there (the reference does the same).
  """
  ends = jnp.minimum(jnp.cumsum(group_sizes.astype(jnp.int32)), num_rows)
  return jnp.concatenate([jnp.zeros((1,), jnp.int32), ends.astype(jnp.int32)])


class RowTileSchedule(NamedTuple):
  """Work items for a sequential grid; arrays have static length ``num_slots``.

  offsets:    [G + 1] row offsets of the scheduled groups.
  item_group: [num_slots] group handled by work item i.
  item_tile:  [num_slots] row tile handled by work item i.
  num_items:  scalar, number of real items; slots past it repeat the last real
              item so that index maps point at already-resident blocks, and the
              kernel skips their compute.
  """

  offsets: jnp.ndarray
  item_group: jnp.ndarray
  item_tile: jnp.ndarray
  num_items: jnp.ndarray


def row_tile_schedule(
  offsets: jnp.ndarray,
  *,
  padded_rows: int,
  tm: int,
  visit_empty_groups: bool,
  cover_padding_rows: bool,
) -> RowTileSchedule:
  """Ordered (group, row tile) work items, one per tile a group touches.

  Args:
    offsets: [E + 1] group row offsets (see ``group_offsets``).
    padded_rows: row count of the (padded) lhs, a multiple of ``tm``.
    tm: rows per tile.
    visit_empty_groups: give each empty group one item (tgmm must still write
      zeros into that group's output block).
    cover_padding_rows: append a pseudo group E spanning
      ``[offsets[E], padded_rows)`` so every row tile is visited at least once
      (gmm must write zeros into padding rows). The pseudo group has id E; the
      kernel must not compute for it.
  """
  if padded_rows % tm:
    raise ValueError(f"padded_rows={padded_rows} is not a multiple of tm={tm}")
  tiles_m = padded_rows // tm
  if cover_padding_rows:
    offsets = jnp.concatenate([offsets, jnp.full((1,), padded_rows, jnp.int32)])
  starts, ends = offsets[:-1], offsets[1:]
  sizes = ends - starts
  num_groups = sizes.shape[0]
  first_tile = jnp.minimum(starts // tm, tiles_m - 1)
  last_tile = (ends - 1) // tm
  empty_items = 1 if visit_empty_groups else 0
  items_per_group = jnp.where(sizes > 0, last_tile - first_tile + 1, empty_items)
  # Each group boundary inside a tile adds at most one extra visit, so
  # tiles_m + G - 1 slots always suffice (empty groups included).
  num_slots = tiles_m + num_groups - 1
  items_end = jnp.cumsum(items_per_group)
  num_items = items_end[-1]
  slot = jnp.minimum(jnp.arange(num_slots, dtype=jnp.int32), num_items - 1)
  item_group = jnp.searchsorted(items_end, slot, side="right").astype(jnp.int32)
  position_in_group = slot - (items_end - items_per_group)[item_group]
  item_tile = (first_tile[item_group] + position_in_group).astype(jnp.int32)
  return RowTileSchedule(offsets, item_group, item_tile, num_items.astype(jnp.int32))


def tile_group_ranges(
  offsets: jnp.ndarray, *, num_tiles: int, tm: int
) -> tuple[jnp.ndarray, jnp.ndarray]:
  """For each row tile, the half-open range [lo, hi) of groups touching it.

  Groups are contiguous and ordered, so the groups intersecting rows
  ``[t*tm, (t+1)*tm)`` are those ending after the tile start and starting
  before the tile end. Empty groups inside the range are harmless (their row
  mask is empty); kernels may skip them.
  """
  starts, ends = offsets[:-1], offsets[1:]
  tile_start = jnp.arange(num_tiles, dtype=jnp.int32) * tm
  lo = jnp.searchsorted(ends, tile_start, side="right")
  hi = jnp.searchsorted(starts, tile_start + tm, side="left")
  return lo.astype(jnp.int32), jnp.maximum(hi, lo).astype(jnp.int32)


def group_tile_ranges(offsets: jnp.ndarray, *, tm: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """For each group, the half-open range [lo, hi) of row tiles it touches.

  Empty groups get an empty range.
  """
  starts, ends = offsets[:-1], offsets[1:]
  lo = starts // tm
  hi = jnp.where(ends > starts, (ends - 1) // tm + 1, lo)
  return lo.astype(jnp.int32), hi.astype(jnp.int32)
