"""Token-choice top-k routing with softmax scores (Shazeer et al. 2017; Switch, GShard).

probs = softmax(logits) over all E experts (float32); each token keeps its k
highest-probability experts. With `renormalize` the kept weights are divided
by their sum (Mixtral, Qwen3 `norm_topk_prob`); without it they are the raw
softmax probabilities (Switch, Qwen2-MoE). Router jitter noise is applied to
the router *input* by the MoE layer (Switch Transformer, sec. 2.4), so this
function stays deterministic given its logits.
"""

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


def validate_top_k(cfg: RouterConfig) -> None:
  if cfg.top_k < 1:
    raise ConfigError(f"model.moe.top_k={cfg.top_k} must be >= 1")
  if cfg.top_k > cfg.num_experts:
    raise ConfigError(
      f"model.moe.top_k={cfg.top_k} must be <= model.moe.num_experts={cfg.num_experts}"
    )


def softmax_top_k(logits: jax.Array, k: int, renormalize: bool) -> tuple[Routing, jax.Array]:
  """(Routing, probs [T, E]): softmax-then-top-k routing of float32 logits [T, E] to k slots."""
  probs = jax.nn.softmax(logits, axis=-1)
  weight, index = top_k_slots(probs, k)
  if renormalize:
    weight = weight / jnp.sum(weight, axis=-1, keepdims=True)
  return Routing(index, weight, jnp.ones(index.shape, bool)), probs


@register_router("topk", validate=validate_top_k, promises={"weights_proportional_to_probs"})
def route_top_k(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  del rng, train
  routing, probs = softmax_top_k(logits, cfg.top_k, cfg.renormalize)
  return RouterOutput(routing, logits, probs, {"routing_entropy": routing_entropy(probs)}, state)
