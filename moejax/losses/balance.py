"""The Switch load-balancing loss and the router z-loss."""

import math

import jax
import jax.numpy as jnp

from moejax.losses.base import LossConfig, register_loss
from moejax.assignment.routing import RouterOutput, Routing


def _output(index, valid, probs, logits) -> RouterOutput:
  valid = jnp.asarray(valid, bool)
  routing = Routing(jnp.asarray(index, jnp.int32), jnp.where(valid, 1.0, 0.0), valid)
  return RouterOutput(
    routing, jnp.asarray(logits, jnp.float32), jnp.asarray(probs, jnp.float32), {}, {}
  )


def load_balance_example():
  """3 tokens, 2 experts, top-1; token 2's slot is invalid (it would be expert 1).
  f = [2, 0] / 2 valid = [1, 0] (the invalid slot counts nowhere); P = column
  means over all 3 tokens = [0.5, 0.5]. Loss = 2 * (1 * 0.5 + 0 * 0.5) = 1."""
  probs = jnp.asarray([[0.75, 0.25], [0.25, 0.75], [0.5, 0.5]])
  return _output([[0], [0], [1]], [[True], [True], [False]], probs, jnp.log(probs)), None, 1.0


def z_loss_example():
  """logits [0, 0] and [log 3, 0]: logsumexp log 2 and log 4 = 2 log 2, so the
  loss is ((log 2)^2 + (2 log 2)^2) / 2 = 2.5 (log 2)^2."""
  logits = [[0.0, 0.0], [math.log(3.0), 0.0]]
  probs = jax.nn.softmax(jnp.asarray(logits), axis=-1)
  return _output([[0], [0]], [[True], [True]], probs, logits), None, 2.5 * math.log(2.0) ** 2


def load_balance_stats(out: RouterOutput, cfg: LossConfig | None = None) -> dict:
  """The non-differentiable part of the load-balance loss as a sum over tokens:
  valid assignments per expert [E] (moejax/losses/base.py, step-level statistics)."""
  num_experts = out.over_experts("probs").shape[-1]
  return {"counts": out.routing.expert_counts(num_experts).astype(jnp.float32)}


@register_loss("load_balance", example=load_balance_example, step_stats=load_balance_stats)
def load_balance_loss(
  out: RouterOutput, cfg: LossConfig | None = None, step_stats=None
) -> jax.Array:
  """Switch Transformer eq. 4: E * sum_e f_e * P_e.

  f_e: fraction of valid assignments that go to expert e (for k > 1 the
  assignments are counted over all k slots, as in GShard / Mixtral), not
  differentiable. P_e: mean router probability of expert e, differentiable.
  Equals 1 at perfect balance with uniform probabilities. With `step_stats`
  (load_balance_stats summed over the step's batch) f is the step's: the loss
  is linear in P given f, so the mean over equal micro-batches is the
  one-batch loss and gradient.
  """
  counts = (load_balance_stats(out) if step_stats is None else step_stats)["counts"]
  fraction = counts / jnp.maximum(jnp.sum(counts), 1.0)
  probs = out.over_experts("probs")
  mean_prob = jnp.mean(probs, axis=0)
  return probs.shape[-1] * jnp.sum(jax.lax.stop_gradient(fraction) * mean_prob)


@register_loss("z_loss", example=z_loss_example)
def router_z_loss(out: RouterOutput, cfg: LossConfig | None = None) -> jax.Array:
  """ST-MoE eq. 5: mean over tokens of logsumexp(logits)^2."""
  return jnp.mean(jnp.square(jax.nn.logsumexp(out.over_experts("logits"), axis=-1)))
