"""Token rounding (SonicMoE, Guo et al. 2025, arXiv 2512.14080; reference code
Dao-AILab/sonic-moe benchmarks/moe-token-rounding.py): router 'topk_rounded'.

Each expert's token count is rounded to a multiple of a tile so that a tiled
grouped matmul wastes no padding rows:
  1. P = softmax(logits) over all E experts (float32); token-choice top-K;
     f_e = number of tokens whose top-K holds e.
  2. f~_e = f_e rounded to a multiple of M = model.moe.topk_rounded.tile:
     'up' ceil, 'down' floor, 'nearest' round half to even (torch.round, as
     the reference's 'nr'); then capped at T (so with T not a multiple of M
     a capped count is T, not a multiple of M).
  3. Score C[t, e] = top-K probability renormalised over the token's top-K
     (> 0) if e is in topK(t), else P[t, e] - 1 (<= 0): every top-K pair
     outranks every other pair, and each group keeps its own order
     (implemented as a lexicographic key - group, then renormalised log-prob
     or P - so P - 1 is never rounded in float32).
  4. Each expert keeps its first f~_e tokens by C. Ties in C (every top-1
     token of an expert when K = 1: its renormalised score is exactly 1) go
     to the higher P[t, e], then the lower token index; the reference leaves
     them to an unstable sort.
     Rounding down drops the expert's lowest-scored top-K tokens; rounding up
     adds its highest-P tokens that did not choose it.
A token may end up with fewer than K experts, more, or none.

Slots (base.Routing): 'down' only ever removes pairs, so S = K (slot s is the
token's s-th top-K expert, invalid when dropped). 'up' and 'nearest' can add
any expert to any token (an expert that rounds up takes its best non-top-K
tokens, and one token can be best for all of them), so no bound below E holds
in general: S = E, slot s is the token's s-th most probable expert, slots
< K are its top-K (valid unless dropped), slots >= K valid when added. Slot-
major order therefore still ranks top-K pairs first (capacity priority).
The total is bounded though (`max_kept_pairs`: T*K + E*(M-1) for 'up',
T*K + E*floor(M/2) for 'nearest'), and the Routing carries that bound as
`max_valid`, so the dropless row buffers are sized by it, not by T*E.

Gates (the reference's rule, benchmarks/moe-token-rounding.py,
`forward_token_choice_rounding`): it divides the top-K values by their sum
and scatters them in place into the softmax scores *before* the gates are
read (`router_scores[token_indices, expert_indices]`), so
  gate[t, e] = P[t, e] / sum_{e' in topK(t)} P[t, e']   if e in topK(t),
  gate[t, e] = P[t, e]                                 if e was added by rounding.
A kept top-K pair is renormalised over the token's whole top-K, also when
rounding down dropped another of its top-K pairs (the sum is not re-taken
over the kept pairs). `model.moe.routing.renormalize` is not used: the rule is
fixed, as in the reference. Selection carries no gradient; the router
learns through the gates (through the renormalising sum too, as the
reference's autograd does).

Evaluation (train=False) routes with plain top-K and renormalised gates
(S = K), the reference's top-K baseline (`forward_topk`: softmax over the top-K
logits), which equals the top-K pairs of training's gates. Train with TR,
evaluate with top-K is moejax's choice, not read in the paper (the reference is
a kernel benchmark with no evaluation): rounding exists for training throughput,
and it couples the tokens of a batch (whether t keeps or gains an expert depends
on the other tokens' scores, later ones included). Evaluation and generation are
therefore plain causal top-K, hence `causal=True`; the training-time coupling is
the same kind as capacity drops.

Settings (model.moe.topk_rounded): tile M (128) and mode (up | down |
nearest, default nearest). The tile is the router's own: dispatch does not
read it (model.moe.dropless.tile is dispatch's padding unit).

Padding waste: with model.moe.dropless.tile dividing topk_rounded.tile the
dropless layout pads nothing (waste 0, unless a count is capped at T).

Departures from the reference: its `forward_token_choice_rounding` overwrites
the tile argument with `Mtile = 128`; moejax uses model.moe.topk_rounded.tile.
Its softmax runs in float32 and is then cast to the activation dtype; moejax
keeps the scores and gates in float32. Ties in step 4 are broken as above.
Earlier moejax versions gave every kept pair the raw P (no renormalisation)
in training and evaluation, against the reference's rule above; results
measured with them do not stand for this router.
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError, choice_error
from moejax.routing.base import (
  RouterConfig,
  RouterOutput,
  Routing,
  register_router,
  routing_entropy,
)
from moejax.routing.topk import softmax_top_k, validate_top_k

ROUNDING_MODES = ("up", "down", "nearest")
# model.moe.topk_rounded (configs saved before the section had flat rounding_* keys).
SETTINGS = {"tile": 128, "mode": "nearest"}
LEGACY_KEYS = {"rounding_tile": "tile", "rounding_mode": "mode"}


def validate_rounding(cfg: RouterConfig) -> None:
  """model.moe.topk_rounded: tile an int >= 1, mode a known one (whatever the router)."""
  s = cfg.settings
  if s["mode"] not in ROUNDING_MODES:
    raise choice_error("model.moe.topk_rounded.mode", s["mode"], ROUNDING_MODES)
  check_tile(s["tile"])


def check_tile(tile) -> None:
  if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
    raise ConfigError(f"model.moe.topk_rounded.tile={tile!r} must be an int >= 1")


def rounded_counts(counts: jax.Array, tile: int, mode: str, num_tokens: int) -> jax.Array:
  """Counts [E] rounded to a multiple of `tile` (step 2 of the module doc), capped at T."""
  quotient, remainder = counts // tile, counts % tile
  if mode == "up":
    quotient = quotient + (remainder > 0)
  elif mode == "nearest":  # half to even
    quotient = quotient + ((2 * remainder > tile) | ((2 * remainder == tile) & (quotient % 2 == 1)))
  elif mode != "down":
    raise choice_error("model.moe.topk_rounded.mode", mode, ROUNDING_MODES)
  return jnp.minimum(quotient * tile, num_tokens).astype(jnp.int32)


def token_rounding(probs: jax.Array, k: int, tile: int, mode: str):
  """Kept pairs of token rounding (module doc, steps 1-4).

  probs float32 [T, E] -> (kept bool [T, E], by_prob int32 [T, E]: each
  token's experts by descending P, the first k being its top-K).
  """
  check_tile(tile)
  num_tokens, num_experts = probs.shape
  probs = jax.lax.stop_gradient(probs)  # selection carries no gradient
  by_prob = jnp.argsort(-probs, axis=1, stable=True).astype(jnp.int32)
  in_top_k = jnp.argsort(by_prob, axis=1) < k  # rank of expert e in the token's order < k
  # log of the renormalised top-k probability (same order, and exactly 0 for
  # K = 1, where a division would leave 1-ulp noise to break the ties).
  log_renormalised = jnp.log(probs) - jnp.log(
    jnp.sum(jnp.where(in_top_k, probs, 0.0), axis=1, keepdims=True)
  )
  counts = jnp.sum(in_top_k, axis=0, dtype=jnp.int32)
  target = rounded_counts(counts, tile, mode, num_tokens)
  # C as a lexicographic key per expert column: top-k pairs first, then by
  # renormalised prob (top-k) or P (others), ties by P, then by token index.
  keys = ((~in_top_k).astype(jnp.int32), -jnp.where(in_top_k, log_renormalised, probs), -probs)
  token = jnp.broadcast_to(jnp.arange(num_tokens, dtype=jnp.int32)[:, None], probs.shape)
  *_, order = jax.lax.sort((*keys, token), dimension=0, is_stable=True, num_keys=len(keys))
  token_rank = jnp.argsort(order, axis=0)
  return token_rank < target[None, :], by_prob


def rounding_metrics(kept, in_top_k):
  kept_f, top_f = kept.astype(jnp.float32), in_top_k.astype(jnp.float32)
  num_top = jnp.maximum(jnp.sum(top_f), 1.0)
  per_token = jnp.sum(kept_f, axis=1)
  return {
    "rounding_dropped_fraction": jnp.sum(top_f * (1 - kept_f)) / num_top,
    "rounding_added_fraction": jnp.sum((1 - top_f) * kept_f) / num_top,
    "experts_per_token": jnp.mean(per_token),
    "tokens_without_expert": jnp.mean((per_token == 0).astype(jnp.float32)),
  }


def max_kept_pairs(num_tokens: int, num_experts: int, k: int, tile: int, mode: str) -> int:
  """Bound on all kept pairs: f~_e <= f_e + (M - 1) ('up'), + M/2 ('nearest'),
  + 0 ('down'), and sum_e f_e = T*K (each bound also <= T*E)."""
  slack = {"up": tile - 1, "nearest": tile // 2, "down": 0}[mode]
  return min(num_tokens * num_experts, num_tokens * k + num_experts * slack)


def rounding_gates(probs: jax.Array, in_top_k: jax.Array) -> jax.Array:
  """Gates [T, E] (module doc, "Gates"): top-K pairs P renormalised over the
  token's top-K, every other pair its raw P (the reference's in-place scatter)."""
  top_k_sum = jnp.sum(jnp.where(in_top_k, probs, 0.0), axis=1, keepdims=True)
  return jnp.where(in_top_k, probs / top_k_sum, probs)


def token_rounding_routing(probs: jax.Array, k: int, tile: int, mode: str):
  """Token rounding as a Routing (slots as in the module doc) and its metrics."""
  probs = probs.astype(jnp.float32)
  kept, by_prob = token_rounding(probs, k, tile, mode)
  num_tokens, num_experts = probs.shape
  num_slots = k if mode == "down" else num_experts
  index = by_prob[:, :num_slots]
  valid = jnp.take_along_axis(kept, index, axis=1)
  in_top_k = (
    jnp.zeros(kept.shape, bool).at[jnp.arange(kept.shape[0])[:, None], by_prob[:, :k]].set(True)
  )
  gates = rounding_gates(probs, in_top_k)
  weight = jnp.where(valid, jnp.take_along_axis(gates, index, axis=1), 0.0)
  bound = max_kept_pairs(num_tokens, num_experts, k, tile, mode)
  return Routing(index, weight, valid, bound), rounding_metrics(kept, in_top_k)


@register_router(
  "topk_rounded",
  validate=validate_top_k,
  settings=SETTINGS,
  legacy_keys=LEGACY_KEYS,
  validate_settings=validate_rounding,
)
def route_token_rounding(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  del rng
  probs = jax.nn.softmax(logits, axis=-1)
  if train:
    s = cfg.settings
    routing, metrics = token_rounding_routing(probs, cfg.top_k, s["tile"], s["mode"])
  else:
    routing, _ = softmax_top_k(logits, cfg.top_k, renormalize=True)
    ones = jnp.ones(routing.valid.shape, bool)
    metrics = rounding_metrics(ones, ones)  # nothing dropped or added, K experts per token
  metrics["routing_entropy"] = routing_entropy(probs)
  return RouterOutput(routing, logits, probs, metrics, state)
