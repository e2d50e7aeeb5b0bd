"""Capacity-aware inference: Token Drop and Expanded Drop (He et al., arXiv 2503.05066).

Read from the official code (CASE-Lab-UMD/Capacity-Aware-MoE,
`capacity_aware/capacity_patch.py`, the versions at commits 174afe8 and
dc16df0); an independent JAX implementation.

Latency under expert parallelism follows the most loaded expert, so each
expert gets a capacity
    C = ceil(gamma * k * T / E)        (T: all tokens of the call)
and the score strategy ("Token Drop", the paper's best) keeps, for each expert
whose load exceeds C, the C routed tokens with the highest softmax
probability P[t, e]; other (token, expert) pairs are dropped (the token keeps
its other experts and the residual path).

Expanded Drop (the official `overselect`): candidates are each token's
top-ceil(k * r) experts by P (r >= 1); the same per-expert score capacity is
applied to all candidate pairs, and each token then keeps its top-k surviving
candidates, so a token bumped from a full expert falls to its next-ranked
expert with room. r = 1 is Token Drop. Note (found by the brute-force test): with
r > 1 the total number of kept pairs can be *lower* than with Token Drop,
because an over-selected candidate with a high score takes capacity that its
token then does not use (it already keeps k better experts). (The paper's version adds experts that
are local to the token's device; the released code's top-ceil(k r) is what is
implemented here.)

Settings (model.moe.capacity_aware): gamma (1.0), expand_r (1.0 = Token
Drop), num_shards (0 = capacity per expert).

Sharded expert axis (`capacity_aware.num_shards` = D > 0; a moejax extension, no
official version read has a per-device capacity, it only applies per
expert): experts are split into D contiguous equal groups (one per
expert-parallel shard) and the capacity applies per shard:
C_dev = ceil(gamma * k * T / D) routes per shard, keeping the highest-P
(token, expert) candidate pairs of that shard.

Weights and `renormalize`. The official patch wraps the host model's gate and
has two paths. (a) Gates that return logits (Mixtral, Qwen-MoE, OLMoE): it
returns the logits with every dropped expert set to finfo.min, and the host
model's own softmax + top-k then runs on them; the dropped experts get
probability 0, so the kept experts' weights are P renormalised over the
token's kept experts, whatever the host's norm_topk_prob says (a later
norm_topk_prob division is by 1). (b) Gates that return (indices, weights)
(DeepSeek): full-softmax P at the kept experts, divided by their sum only
when the gate's norm_topk_prob is set. moejax's `renormalize=True` (the
default) is path (a), and path (b) with norm_topk_prob; `renormalize=False`
is path (b) without it (raw P at the kept experts). So for a host whose gate
returns logits and whose norm_topk_prob is off (Qwen2-MoE), the official
behaviour is `renormalize=True`, not the host's setting.

Slots: S = k, dropped slots invalid (index 0, weight 0). Static shapes
throughout. As in the official code no capacity is applied when T <= 1
(single-token decode). Difference: the official logits path (dc16df0) gives a
token that lost every expert its argmax expert back; here such a token keeps
only the residual (so max load <= C always holds).

NON-CAUSAL: whether a token keeps an expert depends on the other tokens of the
call (prefill batch), as intended for inference-time load shaping.
"""

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError
from moejax.routing.base import (
  RouterConfig,
  RouterOutput,
  Routing,
  register_router,
  routing_entropy,
  top_k_slots,
)
from moejax.routing.topk import validate_top_k


def token_capacity(num_tokens: int, num_groups: int, top_k: int, gamma: float) -> int:
  """ceil(gamma * k * T / groups), at least 1 (groups: experts or shards)."""
  return max(1, math.ceil(gamma * top_k * num_tokens / num_groups))


def num_candidates(num_experts: int, top_k: int, expand_r: float) -> int:
  return min(num_experts, max(top_k, math.ceil(top_k * expand_r)))


def rank_within(scores: jax.Array) -> jax.Array:
  """Rank of each entry along the last axis, 0 = highest; ties to the lower index."""
  order = jnp.argsort(-scores, axis=-1, stable=True)
  return jnp.argsort(order, axis=-1, stable=True)


def keep_top_per_group(
  scores: jax.Array, candidate: jax.Array, capacity, num_groups: int
) -> jax.Array:
  """Keep, in each of `num_groups` contiguous expert groups, the `capacity`
  highest-scoring candidate (token, expert) pairs. scores/candidate: [T, E];
  `capacity` may be a traced integer."""
  num_tokens, num_experts = scores.shape
  per = num_experts // num_groups
  masked = jnp.where(candidate, scores, -jnp.inf)
  flat = masked.reshape(num_tokens, num_groups, per).transpose(1, 0, 2).reshape(num_groups, -1)
  keep = rank_within(flat) < capacity  # ties: lower (token, expert) first
  keep = keep.reshape(num_groups, num_tokens, per).transpose(1, 0, 2)
  return keep.reshape(num_tokens, num_experts) & candidate


def capacity_route(
  probs: jax.Array, top_k: int, capacity, num_cand, num_shards: int = 0, renormalize: bool = True
) -> Routing:
  """Token Drop (num_cand = k) / Expanded Drop (num_cand = ceil(k r)) routing of probs [T, E].

  capacity: per expert (num_shards = 0) or per shard, None for no limit;
  capacity and num_cand may be traced integers (see `token_capacity`,
  `num_candidates`). Returns k slots per token, dropped slots invalid.
  """
  num_experts = probs.shape[1]
  candidate = rank_within(probs) < num_cand
  if capacity is None:
    kept = candidate
  else:
    kept = keep_top_per_group(probs, candidate, capacity, num_shards or num_experts)
  value, index = top_k_slots(jnp.where(kept, probs, -jnp.inf), top_k)
  valid = jnp.isfinite(value)
  weight = jnp.where(valid, jnp.take_along_axis(probs, index, 1), 0.0)
  if renormalize:
    weight = weight / jnp.maximum(jnp.sum(weight, axis=-1, keepdims=True), 1e-20)
  return Routing(jnp.where(valid, index, 0), weight, valid)


# model.moe.capacity_aware (configs saved before the section had flat capacity_* keys).
SETTINGS = {"gamma": 1.0, "expand_r": 1.0, "num_shards": 0}
LEGACY_KEYS = {
  "capacity_gamma": "gamma",
  "capacity_expand_r": "expand_r",
  "capacity_num_shards": "num_shards",
}


def validate_keys(cfg: RouterConfig) -> None:
  """model.moe.capacity_aware: gamma > 0, expand_r >= 1, num_shards 0 or dividing
  num_experts (whatever the router)."""
  s = cfg.settings
  if s["gamma"] <= 0:
    raise ConfigError(f"model.moe.capacity_aware.gamma={s['gamma']} must be > 0")
  if s["expand_r"] < 1:
    raise ConfigError(f"model.moe.capacity_aware.expand_r={s['expand_r']} must be >= 1")
  shards = s["num_shards"]
  if shards < 0 or (shards > 0 and cfg.num_experts % shards):
    raise ConfigError(
      f"model.moe.capacity_aware.num_shards={shards} must be 0 (per-expert "
      f"capacity) or divide model.moe.num_experts={cfg.num_experts}"
    )


@register_router(
  "capacity_aware",
  causal=False,
  validate=validate_top_k,
  promises={"weights_proportional_to_probs"},
  settings=SETTINGS,
  legacy_keys=LEGACY_KEYS,
  validate_settings=validate_keys,
)
def route_capacity_aware(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  del rng, train
  s = cfg.settings
  probs = jax.nn.softmax(logits, axis=-1)
  num_tokens, num_experts = logits.shape
  shards = s["num_shards"]
  capacity = (
    None
    if num_tokens <= 1
    # single-token decode: no capacity (official)
    else token_capacity(num_tokens, shards or num_experts, cfg.top_k, s["gamma"])
  )
  routing = capacity_route(
    probs,
    cfg.top_k,
    capacity,
    num_candidates(num_experts, cfg.top_k, s["expand_r"]),
    shards,
    cfg.renormalize,
  )
  kept = jnp.sum(routing.valid).astype(jnp.float32)
  metrics = {
    "routing_entropy": routing_entropy(probs),
    "router_dropped_fraction": 1.0 - kept / routing.valid.size,
  }
  return RouterOutput(routing, logits, probs, metrics, state)
