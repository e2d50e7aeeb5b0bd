"""Group metadata: every (row tile, group) pair that shares rows is visited once."""

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from gmm_test_oracles import ragged_layouts
from moejax.kernels import gmm_metadata


def touching_pairs(group_sizes, m, tm):
  """Brute force: {(group, tile)} sharing at least one row (rows < m)."""
  pairs, start = set(), 0
  for g, size in enumerate(group_sizes):
    for row in range(start, min(start + size, m)):
      pairs.add((g, row // tm))
    start += size
  return pairs


def padded(m, tm):
  return -(-m // tm) * tm


@settings(max_examples=12, deadline=None)  # each new shape compiles (suite budget)
@given(ragged_layouts(), st.sampled_from([8, 16]), st.booleans())
def test_schedule_visits_each_touching_pair_once_in_order(layout, tm, for_tgmm):
  sizes, m = layout
  m_pad = padded(m, tm)
  offsets = gmm_metadata.group_offsets(jnp.asarray(sizes, jnp.int32), m)
  sched = gmm_metadata.row_tile_schedule(
    offsets, padded_rows=m_pad, tm=tm, visit_empty_groups=for_tgmm, cover_padding_rows=not for_tgmm
  )
  count = int(sched.num_items)
  groups = np.asarray(sched.item_group)
  tiles = np.asarray(sched.item_tile)
  items = list(zip(groups[:count].tolist(), tiles[:count].tolist()))

  expected = touching_pairs(sizes, m, tm)
  num_groups = len(sizes)
  if for_tgmm:  # each empty group still gets one item, in range
    empty = {g for g in range(num_groups) if sizes[g] == 0}
    assert sorted(g for g, _ in items if g in empty) == sorted(empty)  # once each
    items = [p for p in items if p[0] not in empty]
  else:  # pseudo group covers padding rows, so every tile is visited
    assert set(tiles[:count].tolist()) == set(range(m_pad // tm))
    expected |= {(num_groups, r // tm) for r in range(min(sum(sizes), m), m_pad)}
  assert sorted(items) == sorted(expected) and len(items) == len(set(items))
  # Ordered by group, hence tiles never decrease (consecutive output revisits).
  assert np.all(np.diff(groups) >= 0) and np.all(np.diff(tiles) >= 0)
  # Slack slots repeat the last real item.
  assert np.all(groups[count:] == groups[count - 1])
  assert np.all(tiles[count:] == tiles[count - 1])
  assert np.all((tiles >= 0) & (tiles < m_pad // tm))


@settings(max_examples=12, deadline=None)  # each new shape compiles (suite budget)
@given(ragged_layouts(), st.sampled_from([8, 16]))
def test_gpu_ranges_cover_touching_pairs(layout, tm):
  sizes, m = layout
  num_tiles = padded(m, tm) // tm
  offsets = gmm_metadata.group_offsets(jnp.asarray(sizes, jnp.int32), m)
  expected = touching_pairs(sizes, m, tm)

  lo, hi = map(np.asarray, gmm_metadata.tile_group_ranges(offsets, num_tiles=num_tiles, tm=tm))
  from_tiles = {(g, t) for t in range(num_tiles) for g in range(lo[t], hi[t]) if sizes[g] > 0}
  assert from_tiles == expected

  lo, hi = map(np.asarray, gmm_metadata.group_tile_ranges(offsets, tm=tm))
  from_groups = {(g, t) for g in range(len(sizes)) for t in range(lo[g], hi[g])}
  assert from_groups == expected


def test_group_offsets_clip_to_rows():
  offsets = gmm_metadata.group_offsets(jnp.array([3, 4, 5], jnp.int32), 8)
  np.testing.assert_array_equal(offsets, [0, 3, 7, 8])
