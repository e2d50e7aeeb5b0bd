"""Expert-choice routing (Zhou et al. 2022, "Mixture-of-Experts with Expert Choice Routing").

probs = softmax(logits) over experts per token; then each expert picks the C
tokens with the highest probability for it, C = ceil(capacity.factor * k * T / E)
(capped at T), so every expert gets exactly C tokens and the average token
gets k * capacity.factor experts (model.moe.capacity). Weights are the chosen probabilities.

NON-CAUSAL: the T tokens are all tokens of the batch, so whether a token is
chosen depends on tokens after it (and in other sequences). Training an LM
this way leaks the future through the routing decision; it is here as the
paper's baseline and for encoder-style use. Do not use it for generation.

Slot view: S = E, slot e is expert e, valid when expert e chose the token.
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
)
from moejax.routing.topk import validate_top_k


def expert_choice_capacity(
  num_tokens: int, num_experts: int, top_k: int, capacity_factor: float
) -> int:
  return min(num_tokens, max(1, math.ceil(capacity_factor * top_k * num_tokens / num_experts)))


def validate_expert_choice(cfg: RouterConfig) -> None:
  validate_top_k(cfg)
  if cfg.capacity_factor <= 0:
    raise ConfigError(f"model.moe.capacity.factor={cfg.capacity_factor} must be > 0")


def expert_choice(probs: jax.Array, capacity: int) -> Routing:
  """Each expert (column of probs [T, E]) keeps its `capacity` best tokens."""
  num_tokens, num_experts = probs.shape
  _, token_index = jax.lax.top_k(probs.T, capacity)  # [E, C]
  chosen = jnp.zeros((num_experts, num_tokens), bool)
  chosen = chosen.at[jnp.arange(num_experts)[:, None], token_index].set(True).T
  expert_index = jnp.broadcast_to(
    jnp.arange(num_experts, dtype=jnp.int32), (num_tokens, num_experts)
  )
  weight = jnp.where(chosen, probs, 0.0)
  return Routing(expert_index, weight, chosen)


@register_router(
  "expert_choice",
  causal=False,
  validate=validate_expert_choice,
  promises={"weights_proportional_to_probs"},
)
def route_expert_choice(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  del rng, train
  probs = jax.nn.softmax(logits, axis=-1)
  capacity = expert_choice_capacity(
    logits.shape[0], logits.shape[1], cfg.top_k, cfg.capacity_factor
  )
  routing = expert_choice(probs, capacity)
  return RouterOutput(routing, logits, probs, {"routing_entropy": routing_entropy(probs)}, state)
