"""GShard-style capacity dispatch (Lepikhin et al. 2020, sec. 2.2).

Each expert has a buffer of C = max(min, ceil(factor * T * k / E)) rows, with the
settings section model.moe.capacity (CAPACITY: factor, min; the expert_choice
router reads model.moe.capacity.factor too). Assignments take buffer rows in
slot-major, then token, order; those past C are dropped (their slot contributes
nothing) and counted. Experts run as one batched matmul over [E, C, d]. Rows are
scattered by index rather than a one-hot einsum: same result, O(T k d) instead of
O(T E C d) work.
"""

import math

import jax
import jax.numpy as jnp

from moejax.assignment.layout import combine, sort_by_expert
from moejax.dispatch.base import CAPACITY_DROPS, register_dispatcher
from moejax.registry import PartSettings, check_number


def validate_capacity(cfg) -> None:
  s = CAPACITY.parse(cfg)
  check_number("model.moe.capacity.factor", s["factor"])
  check_number("model.moe.capacity.min", s["min"], integer=True, strict=False)


CAPACITY = PartSettings(
  "capacity",
  "capacity (dispatch 'capacity', router 'expert_choice')",
  (("factor", 1.25), ("min", 4)),
  legacy_keys=(("capacity_factor", "factor"), ("min_capacity", "min")),
  validate=validate_capacity,
)


def expert_capacity(
  num_tokens: int, num_experts: int, top_k: int, capacity_factor: float, min_capacity: int
) -> int:
  return max(min_capacity, math.ceil(capacity_factor * num_tokens * top_k / num_experts))


def capacity_of(cfg, num_tokens: int) -> int:
  """C for `num_tokens` tokens under the MoE config `cfg` (model.moe.capacity)."""
  s = CAPACITY.parse(cfg)
  return expert_capacity(num_tokens, cfg.num_experts, cfg.top_k, s["factor"], s["min"])


def batched_matmul(rows: jax.Array, w: jax.Array) -> jax.Array:
  """rows [E, C, a] @ w [E, a, b] -> [E, C, b]."""
  return jnp.einsum("eca,eab->ecb", rows, w)


@register_dispatcher("capacity", settings=CAPACITY, drops=CAPACITY_DROPS)
def dispatch_capacity(x, routing, expert_fn, cfg):
  num_tokens, d = x.shape
  num_experts = cfg.num_experts
  capacity = capacity_of(cfg, num_tokens)
  sorted_ = sort_by_expert(routing, num_experts)
  kept = (sorted_.expert < num_experts) & (sorted_.position < capacity)
  out_of_range = num_experts * capacity
  slot = jnp.where(kept, sorted_.expert * capacity + sorted_.position, out_of_range)
  buffer = jnp.zeros((num_experts * capacity, d), x.dtype)
  buffer = buffer.at[slot].set(x[sorted_.token], mode="drop")
  out = expert_fn(buffer.reshape(num_experts, capacity, d), batched_matmul)
  y_sorted = out.reshape(num_experts * capacity, -1).at[slot].get(mode="fill", fill_value=0)
  num_valid = jnp.sum(sorted_.group_sizes)
  dropped = num_valid - jnp.sum(kept)
  metrics = {
    "dropped_fraction": dropped / jnp.maximum(num_valid, 1),
    "capacity": jnp.asarray(capacity, jnp.float32),
  }
  # A dropped assignment must not count in the combine: its slot gets weight 0.
  return combine(y_sorted, sorted_, routing, x.dtype), metrics
