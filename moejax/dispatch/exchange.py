"""The token exchange between expert-parallel peers: a fixed-capacity or a ragged all_to_all.

Each device's assignments, sorted by expert, are contiguous per destination
peer (peer j holds experts [j E_l, (j+1) E_l)). From the per-expert counts of
every peer (one all_gather of n_ep x E int32) every device knows the whole
traffic matrix pair[src, dst] and so, without further messages, where each row
goes, where it lands and which local expert it is for.

  'fixed'   jax.lax.all_to_all of an [n_ep, R, d] buffer: R rows per peer,
            padding included (any platform; XLA:CPU has no ragged all_to_all).
  'ragged'  jax.lax.ragged_all_to_all (TPU, GPU): only real rows move; each
            receiver packs its sources' chunks, in peer order, into n_ep * R rows.
Rows past a buffer are not sent: `Exchange.sent` says which arrived, so the
caller counts them as dropped. R comes from `rows_per_peer` (see there).
"""

import math

import jax
import jax.numpy as jnp

from moejax.assignment.layout import SortedAssignments
from moejax.routing.base import Routing

# Looked up at trace time, so tests swap in `emulated_ragged_all_to_all` on CPU.
ragged_all_to_all = jax.lax.ragged_all_to_all


def axis_name(axes):
  """A mesh axis, or a tuple of them, as collectives take it."""
  return axes[0] if len(axes) == 1 else tuple(axes)


def exclusive_cumsum(x, axis=0):
  return jnp.cumsum(x, axis=axis) - x


def emulated_ragged_all_to_all(
  operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name
):
  """jax.lax.ragged_all_to_all's semantics from a dense all_to_all (tests on CPU).

  Every chunk is padded to operand's length, so it moves n_ep x the rows;
  only for checking the ragged bookkeeping where the real op is missing.
  """
  rows = operand.shape[0]
  offsets = jnp.arange(rows, dtype=jnp.int32)
  chunks = operand.at[input_offsets[:, None] + offsets].get(mode="fill", fill_value=0)
  chunks = jnp.where((offsets < send_sizes[:, None])[..., None], chunks, 0)
  received = jax.lax.all_to_all(chunks, axis_name, 0, 0)
  placed_at = jax.lax.all_to_all(output_offsets[:, None], axis_name, 0, 0)[:, 0]
  dest = jnp.where(offsets < recv_sizes[:, None], placed_at[:, None] + offsets, output.shape[0])
  return output.at[dest.reshape(-1)].set(received.reshape(-1, operand.shape[-1]), mode="drop")


class Exchange:
  """Who sends which sorted rows to whom, from the all-gathered per-expert counts.

  pair[i, j]: rows peer i has for peer j's experts; kept[i, j]: how many of
  them fit (see module doc). On the sender, sorted assignment p goes to peer
  dest[p] at position pos[p] of that peer's group; it is sent if sent[p].
  """

  def __init__(
    self,
    sorted_: SortedAssignments,
    num_experts: int,
    expert_axes: tuple,
    num_peers: int,
    rows_per_peer: int,
    kind: str,
  ):
    self.sorted, self.kind, self.axis = sorted_, kind, axis_name(expert_axes)
    self.num_peers, self.rows_per_peer = num_peers, rows_per_peer
    self.local_experts = num_experts // num_peers
    counts = jax.lax.all_gather(sorted_.group_sizes, self.axis)  # [n_ep, E]
    self.per_expert = counts.reshape(num_peers, num_peers, self.local_experts)
    self.pair = self.per_expert.sum(-1)
    self.me = jax.lax.axis_index(self.axis)
    if kind == "fixed":
      self.kept = jnp.minimum(self.pair, rows_per_peer)
      self.recv_offsets = jnp.arange(num_peers, dtype=jnp.int32) * rows_per_peer
    else:  # ragged: chunks packed in source order into num_peers * R rows
      self.landing = exclusive_cumsum(self.pair, 0)  # [src, dst] offset at dst
      self.kept = jnp.clip(num_peers * rows_per_peer - self.landing, 0, self.pair)
      self.recv_offsets = self.landing[:, self.me]
    self.send_starts = exclusive_cumsum(self.pair, 1)  # [src, dst] start in src's sorted rows
    valid = sorted_.expert < num_experts
    self.dest = jnp.where(valid, sorted_.expert // self.local_experts, num_peers)
    safe_dest = jnp.minimum(self.dest, num_peers - 1)
    self.pos = (
      jnp.arange(sorted_.expert.shape[0], dtype=jnp.int32) - self.send_starts[self.me, safe_dest]
    )
    self.sent = valid & (self.pos < self.kept[self.me, safe_dest])

  @property
  def num_recv_rows(self) -> int:
    return self.num_peers * self.rows_per_peer

  def send(self, rows_sorted: jax.Array) -> jax.Array:
    """Sorted rows [T*S, d] -> the rows this device receives [n_ep * R, d]."""
    if self.kind == "fixed":
      slot = jnp.where(self.sent, self.dest * self.rows_per_peer + self.pos, self.num_recv_rows)
      buffer = jnp.zeros((self.num_recv_rows, rows_sorted.shape[-1]), rows_sorted.dtype)
      buffer = buffer.at[slot].set(rows_sorted, mode="drop")
      return self._all_to_all(buffer)
    output = jnp.zeros((self.num_recv_rows, rows_sorted.shape[-1]), rows_sorted.dtype)
    return ragged_all_to_all(
      rows_sorted,
      output,
      self.send_starts[self.me],
      self.kept[self.me],
      self.landing[self.me],
      self.kept[:, self.me],
      axis_name=self.axis,
    )

  def send_back(self, rows_recv: jax.Array) -> jax.Array:
    """Received rows' outputs -> outputs in this device's sorted order (0 if not sent)."""
    if self.kind == "fixed":
      back = self._all_to_all(rows_recv)
      slot = jnp.where(self.sent, self.dest * self.rows_per_peer + self.pos, self.num_recv_rows)
      return back.at[slot].get(mode="fill", fill_value=0)
    output = jnp.zeros((self.sorted.expert.shape[0], rows_recv.shape[-1]), rows_recv.dtype)
    back = ragged_all_to_all(
      rows_recv,
      output,
      self.recv_offsets,
      self.kept[:, self.me],
      self.send_starts[:, self.me],
      self.kept[self.me],
      axis_name=self.axis,
    )
    return jnp.where(self.sent[:, None], back, 0)

  def received_routing(self) -> Routing:
    """One slot of weight 1 per received row: its local expert, valid if it holds a row."""
    row = jnp.arange(self.num_recv_rows, dtype=jnp.int32)
    src = jnp.sum(self.recv_offsets[None, :] <= row[:, None], axis=1) - 1
    q = row - self.recv_offsets[src]
    valid = q < self.kept[src, self.me]
    bounds = jnp.cumsum(self.per_expert[:, self.me, :], axis=-1)[src]  # [rows, E_local]
    local_expert = jnp.minimum(jnp.sum(bounds <= q[:, None], axis=1), self.local_experts - 1)
    return Routing(
      jnp.where(valid, local_expert, 0).astype(jnp.int32)[:, None],
      valid.astype(jnp.float32)[:, None],
      valid[:, None],
    )

  def _all_to_all(self, buffer):
    d = buffer.shape[-1]
    out = jax.lax.all_to_all(buffer.reshape(self.num_peers, self.rows_per_peer, d), self.axis, 0, 0)
    return out.reshape(self.num_recv_rows, d)


def rows_per_peer(
  cfg, num_tokens: int, num_slots: int, num_peers: int, factor: float, capacity: int | None
) -> int:
  """R, the static receive rows per expert-axis peer (`sharding.a2a_capacity_factor`).

  factor 0: R = T_local * min(S, E_local), which no routing overflows (a
  token's slots name distinct experts, at most E_local of them on one peer).
  factor f > 0: at most ceil(f * T_local * top_k / n_ep), f times the mean load.
  Capacity dispatch keeps at most C rows per expert, so E_local * C also
  suffices.
  """
  local_experts = cfg.num_experts // num_peers
  rows = num_tokens * min(num_slots, local_experts)
  if factor > 0:
    rows = min(rows, math.ceil(factor * num_tokens * cfg.top_k / num_peers))
  if capacity is not None:
    rows = min(rows, local_experts * capacity)
  return max(rows, 1)
