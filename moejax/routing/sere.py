"""SERE: similarity-based expert re-routing for batched decoding (arXiv 2602.07616).

Read from the official code (JL-Cheng/SERE, `rerouting_kernel.cu`,
`calibration/`); an independent JAX implementation.

Offline, per layer: a similarity matrix Sim [E, E] between experts, from all
experts' outputs on calibration tokens (linear CKA:
moejax.analysis.expert_similarity.linear_cka_matrix).

Online, per decode batch (all T tokens of the call):
  * primary set P = the union over tokens of each token's s highest-weight
    valid slots (`model.moe.sere.primary_slots`, default 1);
  * every other valid slot whose expert e is not in P is re-routed, keeping
    its weight, to e* = argmax_{p in P} Sim[e, p] when Sim[e, e*] >= rho
    (`model.moe.sere.rho`, default 0.5); otherwise e stays (a "critical" expert);
  * slots whose expert is in P are unchanged.
So the batch touches fewer distinct experts (never more: every target is
already active). Differences from the kernel: (1) a re-routed slot that lands
on an expert the token already uses is merged into that slot (weights added,
the duplicate made invalid) - the same output with one expert call less;
(2) the kernel skips the threshold when it is 0 (always re-route); here rho = 0
also always re-routes for non-negative similarities, and slots are ranked by
weight rather than assumed sorted.

Router "sere": softmax top-k (as "topk") and, at evaluation only, re-routing
with the similarity matrix kept as non-trained router state
(state["expert_similarity"], init identity = no re-routing for rho > 0; an
analysis step writes the calibrated matrix there). Training is plain top-k.
NON-CAUSAL in the strict sense: the primary set is shared by all tokens of the
call (in decode, the concurrent sequences of one step).
Training never changes the similarity state: its `update_state` (the protocol
of moejax/routing/base.py) is the identity over no stats, so micro-batching is
exact for it.
"""

import dataclasses
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
)
from moejax.routing.topk import softmax_top_k, validate_top_k


def primary_experts(
  routing: Routing, num_experts: int, num_primary: int
) -> tuple[jax.Array, jax.Array]:
  """bool [E]: experts in some token's `num_primary` highest-weight valid slots,
  and bool [T, S]: which slots are primary."""
  w = jnp.where(routing.valid, routing.combine_weight, -jnp.inf)
  # rank of each slot within its token (0 = largest weight; ties to lower slot)
  order = jnp.argsort(-w, axis=1, stable=True)
  rank = jnp.argsort(order, axis=1, stable=True)
  primary_slot = routing.valid & (rank < num_primary)
  hit = (
    jnp.zeros((num_experts,), jnp.int32)
    .at[routing.expert_index]
    .add(primary_slot.astype(jnp.int32))
  )
  return hit > 0, primary_slot


def merge_duplicate_slots(routing: Routing) -> Routing:
  """Merge valid slots of a token that share an expert into the first one."""
  idx, w, valid = routing.expert_index, routing.masked_weight(), routing.valid
  same = (idx[:, :, None] == idx[:, None, :]) & valid[:, :, None] & valid[:, None, :]
  num_slots = idx.shape[1]
  earlier = jnp.tril(jnp.ones((num_slots, num_slots), bool), k=-1)  # [s, s']: s' < s
  first = valid & ~jnp.any(same & earlier[None], axis=2)
  weight = jnp.where(first, jnp.sum(jnp.where(same, w[:, None, :], 0.0), axis=2), 0.0)
  return Routing(jnp.where(first, idx, 0), weight, first)


def sere_reroute(routing: Routing, similarity: jax.Array, num_primary: int, rho: float) -> Routing:
  """Re-route secondary slots to the most similar primary expert (see module doc)."""
  num_experts = similarity.shape[0]
  in_primary, primary_slot = primary_experts(routing, num_experts, num_primary)
  sim = jnp.where(in_primary[None, :], similarity.astype(jnp.float32), -jnp.inf)
  best = jnp.argmax(sim, axis=1).astype(jnp.int32)  # [E]: target for each expert
  best_sim = jnp.max(sim, axis=1)
  e = routing.expert_index
  move = routing.valid & ~primary_slot & ~in_primary[e] & (best_sim[e] >= rho)
  moved = dataclasses.replace(routing, expert_index=jnp.where(move, best[e], e))
  return merge_duplicate_slots(moved)


def init_sere_state(num_experts: int):
  return {"expert_similarity": jnp.eye(num_experts, dtype=jnp.float32)}


# model.moe.sere (configs saved before the section had flat sere_* keys).
SETTINGS = {"primary_slots": 1, "rho": 0.5}
LEGACY_KEYS = {"sere_primary_slots": "primary_slots", "sere_rho": "rho"}


def validate_keys(cfg: RouterConfig) -> None:
  """model.moe.sere: rho in [0, 1], primary_slots >= 1 (whatever the router)."""
  s = cfg.settings
  if not 0.0 <= s["rho"] <= 1.0:
    raise ConfigError(f"model.moe.sere.rho={s['rho']} must be in [0, 1]")
  if s["primary_slots"] < 1:
    raise ConfigError(f"model.moe.sere.primary_slots={s['primary_slots']} must be >= 1")


def validate_sere(cfg: RouterConfig) -> None:
  """The router in use: top_k, and primary_slots <= top_k."""
  validate_top_k(cfg)
  slots = cfg.settings["primary_slots"]
  if slots > cfg.top_k:
    raise ConfigError(
      f"model.moe.sere.primary_slots={slots} must be <= model.moe.top_k={cfg.top_k}"
    )


def keep_sere_state(state, stats, cfg: RouterConfig):
  """The state-update protocol: training leaves the similarity matrix alone."""
  del stats, cfg
  return state


@register_router(
  "sere",
  init_state=init_sere_state,
  causal=False,
  validate=validate_sere,
  update_state=keep_sere_state,
  settings=SETTINGS,
  legacy_keys=LEGACY_KEYS,
  validate_settings=validate_keys,
)
def route_sere(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  del rng
  routing, probs = softmax_top_k(logits, cfg.top_k, cfg.renormalize)
  num_experts = logits.shape[-1]
  metrics = {"routing_entropy": routing_entropy(probs)}
  if not train:
    before = jnp.sum(routing.expert_counts(num_experts) > 0)
    s = cfg.settings
    routing = sere_reroute(
      routing, jax.lax.stop_gradient(state["expert_similarity"]), s["primary_slots"], s["rho"]
    )
    after = jnp.sum(routing.expert_counts(num_experts) > 0)
    metrics["sere_active_expert_reduction"] = (before - after).astype(jnp.float32)
  return RouterOutput(routing, logits, probs, metrics, state)
