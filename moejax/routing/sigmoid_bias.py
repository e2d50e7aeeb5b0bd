"""Sigmoid scores with the auxiliary-loss-free balancing bias (DeepSeek-V3, sec. 2.1.2).

s = sigmoid(logits). Experts are *selected* by top-k of s + b, where b is a
per-expert bias that receives no gradient; the *weights* use s alone,
normalised over the selected experts and scaled by `routed_scaling_factor`.
After each training step the bias moves against the observed imbalance:
    b_e <- b_e + u * sign(mean_load - load_e)
(load_e = assignments to e in the batch), so overloaded experts become less
likely to be picked. The update is computed from this batch's load inside the
forward pass and takes effect from the next step; evaluation leaves b alone.
The load is reported as `stats["expert_counts"]` and the rule is the router's
`update_state` (moejax/routing/base.py): with train.micro_batches > 1 the
counts are summed over the micro-batches and the bias moves once per step,
from the load of the whole batch, exactly as with one batch.
`probs` (for optional balance losses) is s normalised to sum 1 per token.
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
from moejax.routing.topk import validate_top_k


def init_bias_state(num_experts: int):
  return {"bias": jnp.zeros((num_experts,), jnp.float32)}


def validate_bias_router(cfg: RouterConfig) -> None:
  validate_top_k(cfg)
  if cfg.bias_update_rate < 0:
    raise ConfigError(f"model.moe.routing.bias_update_rate={cfg.bias_update_rate} must be >= 0")


def bias_update(bias: jax.Array, counts: jax.Array, rate: float) -> jax.Array:
  """One sign-rule step: raise the bias of under-loaded experts, lower the rest."""
  counts = counts.astype(jnp.float32)
  return bias + rate * jnp.sign(jnp.mean(counts) - counts)


def update_bias_state(state, stats, cfg: RouterConfig):
  """The state-update protocol: one sign-rule step from the summed expert counts."""
  return {
    "bias": bias_update(
      jax.lax.stop_gradient(state["bias"]), stats["expert_counts"], cfg.bias_update_rate
    )
  }


def load_stats(routing: Routing, num_experts: int) -> dict:
  """Accumulable statistics of one call: valid assignments per expert (int32 [E])."""
  return {"expert_counts": routing.expert_counts(num_experts)}


@register_router(
  "sigmoid_bias",
  init_state=init_bias_state,
  validate=validate_bias_router,
  update_state=update_bias_state,
)
def route_sigmoid_bias(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  del rng
  scores = jax.nn.sigmoid(logits)
  bias = jax.lax.stop_gradient(state["bias"])
  _, index = top_k_slots(scores + bias, cfg.top_k)
  weight = jnp.take_along_axis(scores, index, axis=-1)
  weight = weight / jnp.sum(weight, axis=-1, keepdims=True)
  weight = weight * cfg.routed_scaling_factor
  routing = Routing(index, weight, jnp.ones(index.shape, bool))
  new_state, stats = {"bias": bias}, {}
  if train:
    stats = load_stats(routing, logits.shape[-1])
    new_state = update_bias_state(state, stats, cfg)
  probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
  metrics = {
    "routing_entropy": routing_entropy(probs),
    "bias_norm": jnp.linalg.norm(new_state["bias"]),
  }
  return RouterOutput(routing, logits, probs, metrics, new_state, stats)
