"""Confidence-adaptive routing supervision (Prism-MoE, ICML 2026; abstract only read).

The dense model's confidence on token t is c_t = max_v p_dense(v | x_<=t), its
largest next-token probability; the supervision is a KL between a target routing
distribution q_t and the router's distribution p_t, weighted by (1 - c_t):
  L = sum_t (1 - c_t) KL(q_t || p_t) / T.
Guesses: the direction KL(q || p); the mean over tokens; the target q_t, here each
expert's share of the layer's output norm under the converted experts
(`output_share`, the signal the trajectory-fitted router is fitted to).

Not a registered loss: the registry's losses see only the router's output
(moejax/losses/base.py: fn(router_output, cfg)), while this one needs the dense
model's logits and the experts' outputs on the same tokens. These are plain float32
functions a fine-tuning loop adds to its objective.
"""

import jax
import jax.numpy as jnp


def confidence_weight(dense_logits: jax.Array) -> jax.Array:
  """1 - max next-token probability, per position: [..., V] -> [...], float32."""
  probs = jax.nn.softmax(dense_logits.astype(jnp.float32), axis=-1)
  return 1.0 - jnp.max(probs, axis=-1)


def output_share(expert_outputs: jax.Array) -> jax.Array:
  """[T, E, d] -> [T, E]: each expert's share of the summed output norms (target q)."""
  norms = jnp.linalg.norm(expert_outputs.astype(jnp.float32), axis=-1)
  return norms / jnp.maximum(norms.sum(-1, keepdims=True), 1e-30)


def routing_supervision(
  router_logits: jax.Array, target: jax.Array, weight: jax.Array
) -> jax.Array:
  """mean_t weight_t KL(target_t || softmax(router_logits_t)), float32 scalar.

  router_logits, target [T, E]; weight [T] (confidence_weight); 0 log 0 = 0."""
  logp = jax.nn.log_softmax(router_logits.astype(jnp.float32), axis=-1)
  q = target.astype(jnp.float32)
  kl = jnp.sum(jnp.where(q > 0, q * (jnp.log(jnp.where(q > 0, q, 1.0)) - logp), 0.0), -1)
  return jnp.mean(weight.astype(jnp.float32) * kl)
