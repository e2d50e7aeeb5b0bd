"""Assignments sorted by expert, the tile-padded row layout that the dropless
backends and fused expert paths share (`tile_layout`), the weighted combine back
to tokens, and the padding-waste figure every router reports.
"""

import jax
import jax.numpy as jnp
from flax import struct

from moejax.assignment.routing import Routing


@struct.dataclass
class SortedAssignments:
  """Assignments (t, s) flattened slot-major and stably sorted by expert.

  Slot-major order (all first choices, then all second choices, ...) gives
  GShard's priority: when capacity runs out, later slots drop first.
  Invalid assignments sort after every expert (key E).
  """

  order: jax.Array  # int32 [T*S]: flat slot-major assignment id, in sorted order
  token: jax.Array  # int32 [T*S]: token of each sorted assignment
  expert: jax.Array  # int32 [T*S]: expert (E for invalid) of each sorted assignment
  position: jax.Array  # int32 [T*S]: rank within its expert's group
  group_sizes: jax.Array  # int32 [E]: valid assignments per expert


def sort_by_expert(routing: Routing, num_experts: int) -> SortedAssignments:
  num_tokens, num_slots = routing.expert_index.shape
  key = jnp.where(routing.valid, routing.expert_index, num_experts).T.reshape(-1)
  order = jnp.argsort(key, stable=True).astype(jnp.int32)
  expert = key[order]
  group_sizes = jnp.bincount(key, length=num_experts + 1).astype(jnp.int32)
  starts = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(group_sizes)[:-1]])
  position = jnp.arange(order.shape[0], dtype=jnp.int32) - starts[expert]
  token = order % num_tokens
  return SortedAssignments(order, token, expert, position, group_sizes[:num_experts])


def combine(
  y_sorted: jax.Array, sorted_: SortedAssignments, routing: Routing, out_dtype
) -> jax.Array:
  """y[t] = sum_s weight[t, s] * y_assignment[t, s], summed in (at least) float32."""
  num_tokens = routing.expert_index.shape[0]
  acc_dtype = jnp.promote_types(jnp.float32, y_sorted.dtype)
  weight_flat = routing.masked_weight().T.reshape(-1)[sorted_.order].astype(acc_dtype)
  contrib = y_sorted.astype(acc_dtype) * weight_flat[:, None]
  y = jnp.zeros((num_tokens, y_sorted.shape[-1]), acc_dtype)
  return y.at[sorted_.token].add(contrib).astype(out_dtype)


def padding_waste(group_sizes: jax.Array, tile: int) -> jax.Array:
  """Padded rows over real rows when each expert's rows are padded to a multiple of `tile`.

  SonicMoE's waste figure, sum_e (ceil(f_e / M) M - f_e) / sum_e f_e, with M
  the dispatch tile (`model.moe.dropless.tile`). 0 when every count is a
  multiple of the tile (token rounding with model.moe.topk_rounded.tile a multiple of it).
  """
  real = jnp.sum(group_sizes)
  padded = jnp.sum(-(-group_sizes // tile) * tile)
  return ((padded - real) / jnp.maximum(real, 1)).astype(jnp.float32)


@struct.dataclass
class TileLayout:
  """Sorted assignments in a row buffer where each expert's group is padded to
  a multiple of `tile` rows, so no tile of `tile` rows spans two experts.

  The buffer has a static size, ceil(V / tile) + E tiles with V = T*S (or
  the routing's `max_valid` bound), enough for any such routing; rows past
  the last group and padding rows belong to no assignment.
  Flat assignment ids are slot-major (s * T + t), as in SortedAssignments.
  """

  row_of_assignment: jax.Array  # int32 [T*S]: buffer row of each assignment (num_rows if invalid)
  row_token: jax.Array  # int32 [num_rows]: token of each row (0 for padding)
  row_assignment: jax.Array  # int32 [num_rows]: flat assignment id (T*S for padding)
  group_sizes: jax.Array  # int32 [E]: valid assignments per expert
  padded_sizes: jax.Array  # int32 [E]: group sizes rounded up to the tile
  padded_starts: jax.Array  # int32 [E]: first buffer row of each expert
  tile: int = struct.field(pytree_node=False)

  @property
  def num_rows(self) -> int:
    return self.row_token.shape[0]

  def tile_expert(self) -> jax.Array:
    """Expert of each tile of the buffer (the last expert for unused tiles), int32."""
    num_experts = self.padded_sizes.shape[0]
    tile_start = jnp.arange(self.num_rows // self.tile, dtype=jnp.int32) * self.tile
    ends = self.padded_starts + self.padded_sizes
    index = jnp.searchsorted(ends, tile_start, side="right")
    return jnp.minimum(index, num_experts - 1).astype(jnp.int32)

  def row_values(self, per_assignment: jax.Array, fill=0) -> jax.Array:
    """Per-row copy of a flat [T*S] per-assignment array (`fill` on padding rows)."""
    extended = jnp.concatenate([per_assignment, jnp.full((1,), fill, per_assignment.dtype)])
    return extended[self.row_assignment]


def tile_layout(routing: Routing, num_experts: int, tile: int) -> TileLayout:
  """Sort `routing`'s valid assignments by expert into the tile-padded buffer."""
  num_tokens, num_slots = routing.expert_index.shape
  num_assign = num_tokens * num_slots
  sorted_ = sort_by_expert(routing, num_experts)
  bound = num_assign if routing.max_valid is None else min(num_assign, routing.max_valid)
  num_rows = (-(-bound // tile) + num_experts) * tile
  padded_sizes = -(-sorted_.group_sizes // tile) * tile
  padded_starts = jnp.cumsum(padded_sizes) - padded_sizes
  is_valid = sorted_.expert < num_experts
  dest = jnp.where(
    is_valid,
    padded_starts[jnp.minimum(sorted_.expert, num_experts - 1)] + sorted_.position,
    num_rows,
  )
  row_of_assignment = jnp.zeros(num_assign, jnp.int32).at[sorted_.order].set(dest)
  row_assignment = (
    jnp.full(num_rows, num_assign, jnp.int32).at[dest].set(sorted_.order, mode="drop")
  )
  row_token = jnp.where(row_assignment < num_assign, row_assignment % num_tokens, 0)
  return TileLayout(
    row_of_assignment,
    row_token.astype(jnp.int32),
    row_assignment,
    sorted_.group_sizes,
    padded_sizes,
    padded_starts,
    tile,
  )


def dropless_metrics(layout: TileLayout) -> dict:
  """What every dropless path reports: nothing dropped, padding waste at its tile."""
  return {
    "dropped_fraction": jnp.zeros((), jnp.float32),
    "padding_waste": padding_waste(layout.group_sizes, layout.tile),
  }


def combine_rows(y_rows: jax.Array, layout: TileLayout, routing: Routing, out_dtype) -> jax.Array:
  """y[t] = sum over rows r of token t of weight(r) * y_rows[r], summed in (at least) float32.

  Padding rows carry weight 0 (and token 0), so they add nothing.
  """
  acc_dtype = jnp.promote_types(jnp.float32, y_rows.dtype)
  weight = layout.row_values(routing.masked_weight().T.reshape(-1)).astype(acc_dtype)
  y = jnp.zeros((routing.num_tokens, y_rows.shape[-1]), acc_dtype)
  return y.at[layout.row_token].add(y_rows.astype(acc_dtype) * weight[:, None]).astype(out_dtype)
