"""Expert parallelism with shard_map (GShard, Lepikhin et al. 2020, sec. 3; DeepSpeed-MoE).

Experts are split over the mesh axes of the `expert` logical axis, tokens over
those of `batch` (which include the expert axes). Inside one shard_map over
the whole mesh, each device:
  1. (capacity dispatch only) drops assignments past each expert's capacity,
     with the *global* semantics of the single-device path (below);
  2. sends its assignments' rows to the peers holding their experts
     (exchange.py: a ragged all_to_all on TPU/GPU, a fixed-capacity one on CPU);
  3. runs its E / n_ep local experts on the rows it received with the
     dropless dispatcher (`model.moe.dispatch` when that is dropless-family,
     else 'dropless'): the fast local path, each received row one slot of
     weight 1;
  4. sums partial outputs over the mesh axes that split the expert FFN width
     (Megatron's row-parallel w_down), sends the rows back with the reverse
     exchange and combines them with the routing weights (float32).

Receive buffers: `sharding.a2a_capacity_factor = 0` (default) sizes them for
the worst case, so nothing overflows; f > 0 sizes them at f x the mean load.
Rows that do not fit are dropped like capacity drops (their slot contributes
nothing) and counted. Metrics: `dropped_fraction` (all drops over all valid
assignments of the global batch), `a2a_overflow_fraction`, and
`busiest_device_rows`, the most rows any device's experts ran (prefill under
expert parallelism waits for that device: analysis/repetition.py).

Capacity semantics: global, as on one device. An expert's capacity
C = capacity_of(cfg, T_global) is filled in GShard's slot-major priority
over the *global* batch (all first choices of all tokens, in token order,
then the second choices, ...). Each device all-gathers the per-(slot,
expert) counts of the token shards ([n_token_shards, S, E] int32, a few KB)
and ranks its own assignments globally. So capacity drops, and the model, do
not depend on the mesh: a checkpoint resumes identically on any layout.
(Real EP systems often use per-shard capacity, GShard's "groups"; that
trades this invariance for one tiny all_gather.)
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import PartitionSpec as P

from moejax.assignment.layout import combine, sort_by_expert
from moejax.dispatch.base import get_dispatcher
from moejax.dispatch.capacity import capacity_of
from moejax.dispatch.exchange import Exchange, axis_name, exclusive_cumsum, rows_per_peer
from moejax.routing.base import Routing


def global_capacity_keep(
  routing: Routing, num_experts: int, capacity: int, token_axes: tuple
) -> jax.Array:
  """valid & (rank in GShard's slot-major priority over the global batch < capacity).

  Global token order is the order of the token shards along `token_axes`
  (the batch split), then local order; see the module doc.
  """
  num_tokens, num_slots = routing.expert_index.shape
  sorted_ = sort_by_expert(routing, num_experts)
  slot = sorted_.order // num_tokens
  expert = jnp.minimum(sorted_.expert, num_experts - 1)
  is_valid = sorted_.expert < num_experts
  counts = (
    jnp.zeros((num_slots, num_experts), jnp.int32).at[slot, expert].add(is_valid.astype(jnp.int32))
  )  # [S, E]
  if token_axes:
    all_counts = jax.lax.all_gather(counts, axis_name(token_axes))  # [n_shards, S, E]
    before_shards = exclusive_cumsum(all_counts)[jax.lax.axis_index(axis_name(token_axes))]
    global_counts = all_counts.sum(0)
  else:
    before_shards, global_counts = jnp.zeros_like(counts), counts
  # position = local earlier slots + rank within this slot on this shard.
  rank_in_slot = sorted_.position - exclusive_cumsum(counts)[slot, expert]
  rank = exclusive_cumsum(global_counts)[slot, expert] + before_shards[slot, expert] + rank_in_slot
  keep_sorted = is_valid & (rank < capacity)
  keep = jnp.zeros(num_tokens * num_slots, bool).at[sorted_.order].set(keep_sorted)
  return keep.reshape(num_slots, num_tokens).T


def local_config(cfg, num_experts: int):
  """`cfg` with num_experts set to the local count (what the local dispatcher sees)."""
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.num_experts = num_experts
  return ml_collections.FrozenConfigDict(c)


def weight_spec(layout, logical_axes, shape) -> P:
  """Inside the shard_map only the expert and FFN-width splits remain (the rest is gathered)."""
  return layout.spec([a if a in ("expert", "mlp") else None for a in logical_axes], shape)


def _split_axes(spec: P, logical_axes, name: str) -> set[str]:
  """Mesh axes that split the dimensions called `name` in `spec`."""
  out: set[str] = set()
  for logical, dim in zip(logical_axes, spec):
    if logical == name and dim:
      out.update((dim,) if isinstance(dim, str) else dim)
  return out


def expert_parallel_dispatch(
  x, routing: Routing, weights: dict, weight_axes: dict, expert_apply, cfg, layout
):
  """The dispatcher contract `(x [T, d], routing, ...) -> (y [T, d], metrics)` across the mesh.

  weights: {name: [E, ...]} expert weights in the compute dtype; weight_axes:
  their logical axes; expert_apply(weights, rows, matmul) the expert function
  (an expert type's `apply`, or BoundExperts.apply with its options bound: the
  local dispatcher then finds the type's fused path, experts.base.experts_of).
  """
  mesh = layout.mesh

  def active(axes):
    return tuple(a for a in axes if mesh.shape[a] > 1)

  token_axes = active(layout.mesh_axes("batch"))
  expert_axes = active(layout.mesh_axes("expert"))
  all_axes = active(mesh.axis_names)
  w_specs = {k: weight_spec(layout, weight_axes[k], w.shape) for k, w in weights.items()}
  width_axes = active(
    sorted(set().union(*(_split_axes(w_specs[k], weight_axes[k], "mlp") for k in weights)))
  )
  num_peers, num_shards = layout.size(expert_axes), layout.size(token_axes)
  local_cfg = local_config(cfg, cfg.num_experts // num_peers)
  local_dispatch = get_dispatcher("dropless" if cfg.dispatch == "capacity" else cfg.dispatch)

  def total(v):
    v = jnp.sum(v, dtype=jnp.float32)
    return jax.lax.psum(v, all_axes) if all_axes else v

  def run_local_experts(rows, rows_routing, local_weights):
    expert_fn = functools.partial(expert_apply, local_weights)
    y, metrics = local_dispatch(rows, rows_routing, expert_fn, local_cfg)
    return (jax.lax.psum(y, width_axes) if width_axes else y), metrics

  def body(x, index, weight, valid, local_weights):
    num_tokens, num_slots = index.shape
    routing = Routing(index, weight, valid)
    capacity = None
    if cfg.dispatch == "capacity":
      capacity = capacity_of(cfg, num_tokens * num_shards)
      routing = routing.with_valid(
        global_capacity_keep(routing, cfg.num_experts, capacity, token_axes)
      )
    if num_peers == 1:
      y, local_metrics = run_local_experts(x, routing, local_weights)
      delivered = processed = routing.valid
    else:
      sorted_ = sort_by_expert(routing, cfg.num_experts)
      exchange = Exchange(
        sorted_,
        cfg.num_experts,
        expert_axes,
        num_peers,
        rows_per_peer(cfg, num_tokens, num_slots, num_peers, layout.a2a_capacity_factor, capacity),
        layout.all_to_all,
      )
      received = exchange.received_routing()
      y_rows, local_metrics = run_local_experts(
        exchange.send(x[sorted_.token]), received, local_weights
      )
      processed = received.valid
      y = combine(exchange.send_back(y_rows), sorted_, routing, x.dtype)
      delivered = exchange.sent
    num_valid = jnp.maximum(total(valid), 1.0)
    rows_here = jnp.sum(processed, dtype=jnp.float32)  # rows this device's experts run
    metrics = {
      "dropped_fraction": 1.0 - total(delivered) / num_valid,
      "a2a_overflow_fraction": (total(routing.valid) - total(delivered)) / num_valid,
      "busiest_device_rows": (jax.lax.pmax(rows_here, all_axes) if all_axes else rows_here),
    }
    if capacity is not None:
      metrics["capacity"] = jnp.asarray(capacity, jnp.float32)
    for name, value in local_metrics.items():  # e.g. padding_waste, averaged over devices
      if name not in metrics:
        metrics[name] = jax.lax.pmean(value, all_axes) if all_axes else value
    return y, metrics

  tokens = P(axis_name(token_axes) if token_axes else None, None)
  fn = jax.shard_map(
    body,
    mesh=mesh,
    in_specs=(tokens, tokens, tokens, tokens, w_specs),
    out_specs=(tokens, P()),
    check_vma=False,
  )
  return fn(x, routing.expert_index, routing.combine_weight, routing.valid, weights)
