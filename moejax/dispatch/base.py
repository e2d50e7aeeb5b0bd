"""Dispatch registry and the sort that every backend shares.

A dispatcher is a pure function
    (x [T, d], routing, expert_fn, cfg) -> (y [T, d], metrics)
where expert_fn(rows, matmul) applies the experts to rows grouped by expert
(see moejax/experts). `cfg` is the layer's MoE ConfigDict.
"""
from typing import Callable

import jax
import jax.numpy as jnp
from flax import struct

from moejax.errors import choice_error
from moejax.routing.base import Routing

DISPATCHERS: dict[str, Callable] = {}


def register_dispatcher(name: str):
  def wrap(fn):
    if name in DISPATCHERS:
      raise ValueError(f"dispatcher {name!r} registered twice")
    DISPATCHERS[name] = fn
    return fn
  return wrap


def get_dispatcher(name: str) -> Callable:
  if name not in DISPATCHERS:
    raise choice_error("model.moe.dispatch", name, DISPATCHERS)
  return DISPATCHERS[name]


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


def combine(y_sorted: jax.Array, sorted_: SortedAssignments, routing: Routing,
            out_dtype) -> jax.Array:
  """y[t] = sum_s weight[t, s] * y_assignment[t, s], summed in (at least) float32."""
  num_tokens = routing.expert_index.shape[0]
  acc_dtype = jnp.promote_types(jnp.float32, y_sorted.dtype)
  weight_flat = routing.masked_weight().T.reshape(-1)[sorted_.order].astype(acc_dtype)
  contrib = y_sorted.astype(acc_dtype) * weight_flat[:, None]
  y = jnp.zeros((num_tokens, y_sorted.shape[-1]), acc_dtype)
  return y.at[sorted_.token].add(contrib).astype(out_dtype)
