"""The Switch load-balancing loss and the router z-loss."""
import jax
import jax.numpy as jnp

from moejax.losses.base import register_loss
from moejax.routing.base import RouterOutput


@register_loss("load_balance")
def load_balance_loss(out: RouterOutput, cfg=None) -> jax.Array:
  """Switch Transformer eq. 4: E * sum_e f_e * P_e.

  f_e: fraction of valid assignments that go to expert e (for k > 1 the
  assignments are counted over all k slots, as in GShard / Mixtral), not
  differentiable. P_e: mean router probability of expert e, differentiable.
  Equals 1 at perfect balance with uniform probabilities.
  """
  num_experts = out.probs.shape[-1]
  counts = out.routing.expert_counts(num_experts).astype(jnp.float32)
  fraction = counts / jnp.maximum(jnp.sum(counts), 1.0)
  mean_prob = jnp.mean(out.probs, axis=0)
  return num_experts * jnp.sum(jax.lax.stop_gradient(fraction) * mean_prob)


@register_loss("z_loss")
def router_z_loss(out: RouterOutput, cfg=None) -> jax.Array:
  """ST-MoE eq. 5: mean over tokens of logsumexp(logits)^2."""
  return jnp.mean(jnp.square(jax.nn.logsumexp(out.logits, axis=-1)))
