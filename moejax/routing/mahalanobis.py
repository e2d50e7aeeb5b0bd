"""MP-MoE: Mahalanobis-pruned expert selection (ICML 2026, "Breaking the Echo Chamber";
OpenReview 7FsbfQgti4).

Per the abstract: routing is ensemble pruning, a diversity-aware subset
selection that maximises a Mahalanobis-distance objective whose covariance is
the expert co-occurrence matrix (no expert parameters needed), solved by a
greedy algorithm with incremental Cholesky updates; about +3% training time and
no inference cost. The paper's equations were not available to us, so the
following is reconstructed (guesses marked):

  * g [T, E]: the router's softmax probabilities (guess: the score vector).
  * Sigma [E, E]: an EMA over training batches of the covariance of the
    selection indicators z [T, E] (z_te = 1 when token t routed to e), plus
    eps * I (guess: covariance form, EMA, ridge). Kept as non-trained router
    state ("cooc_cov", init 0, so the first steps are plain top-k) and updated
    in the forward pass during training, like the aux-loss-free bias.
  * Objective per token (guess): f(S) = g_S^T Sigma_SS^-1 g_S, |S| = k.
  * Greedy: add the j maximising the gain
        f(S + j) - f(S) = (g_j - Sigma_jS Sigma_SS^-1 g_S)^2
                          / (Sigma_jj - Sigma_jS Sigma_SS^-1 Sigma_Sj),
    computed for all candidates at once with incremental Cholesky updates:
    for the chosen s (residual variance d_s^2, residual score r_s)
        e_j  = (Sigma_sj - <c_s, c_j>) / d_s,   c_j <- [c_j, e_j]
        d_j^2 <- d_j^2 - e_j^2,                 r_j <- r_j - e_j r_s / d_s
    and gain_j = r_j^2 / d_j^2 (c_j: the row of L^-1 Sigma_Sj; O(T E k) per step).
    With Sigma = I this is top-k by g^2 (= top-k by g, as g > 0). Two
    perfectly correlated experts with equal scores give a zero gain to the
    second once the first is in.
  * State-update protocol (moejax/routing/base.py): the batch covariance is
    computed from accumulable sums over tokens, stats = {indicator_sum: sum_t z_t,
    indicator_outer_sum: sum_t z_t z_t^T, tokens: T}, as
    Cov = S_zz / T - (S_z / T)(S_z / T)^T, and `update_mp_state` applies the
    EMA once. With train.micro_batches > 1 the sums of all micro-batches give the
    covariance of the whole batch (integer-valued sums: exact in float32), so
    the state after the step is the one-batch state.
  * Settings (model.moe.mahalanobis): ema_decay (0.99) and ridge eps (1e-3).
  * Inference (train=False): plain softmax top-k ("no additional latency at
    inference time"). Weights in both modes: the softmax probabilities of the
    chosen experts, renormalised when `renormalize`.
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
)
from moejax.routing.topk import softmax_top_k, validate_top_k

_TINY = 1e-12


def greedy_mahalanobis(g: jax.Array, sigma: jax.Array, k: int):
  """Greedy k-subset per token maximising g_S^T Sigma_SS^-1 g_S.

  g [T, E], sigma [E, E] (symmetric positive definite). Returns
  (index int32 [T, k] in the order chosen, gains float32 [T, k]: the increase
  of the objective at each step, so cumsum(gains) = f of each prefix).
  """
  num_tokens, num_experts = g.shape
  g = g.astype(jnp.float32)
  sigma = sigma.astype(jnp.float32)
  chol = jnp.zeros((num_tokens, num_experts, k), jnp.float32)  # c_j per token
  resid_var = jnp.broadcast_to(jnp.diag(sigma), g.shape)  # d_j^2
  resid = g  # r_j
  taken = jnp.zeros(g.shape, bool)
  rows = jnp.arange(num_tokens)
  indices, gains = [], []
  for step in range(k):
    gain = jnp.square(resid) / jnp.maximum(resid_var, _TINY)
    gain = jnp.where(taken, -jnp.inf, gain)
    s = jnp.argmax(gain, axis=-1)
    indices.append(s)
    gains.append(gain[rows, s])
    d_s = jnp.sqrt(jnp.maximum(resid_var[rows, s], _TINY))  # [T]
    c_s = chol[rows, s]  # [T, k]
    e = (sigma[s] - jnp.einsum("tk,tjk->tj", c_s, chol)) / d_s[:, None]
    chol = chol.at[:, :, step].set(e)
    resid = resid - e * (resid[rows, s] / d_s)[:, None]
    resid_var = resid_var - jnp.square(e)
    taken = taken.at[rows, s].set(True)
  return jnp.stack(indices, 1).astype(jnp.int32), jnp.stack(gains, 1)


def batch_cooccurrence_cov(routing: Routing, num_experts: int) -> jax.Array:
  """Covariance over tokens of the selection indicators z [T, E]."""
  z = jnp.zeros((routing.num_tokens, num_experts), jnp.float32)
  z = z.at[jnp.arange(routing.num_tokens)[:, None], routing.expert_index].add(
    routing.valid.astype(jnp.float32)
  )
  zc = z - jnp.mean(z, axis=0)
  return zc.T @ zc / routing.num_tokens


def indicator_stats(routing: Routing, num_experts: int) -> dict:
  """Accumulable sums over the call's tokens of z [T, E], z z^T, and the token count."""
  z = jnp.zeros((routing.num_tokens, num_experts), jnp.float32)
  z = z.at[jnp.arange(routing.num_tokens)[:, None], routing.expert_index].add(
    routing.valid.astype(jnp.float32)
  )
  return {
    "indicator_sum": jnp.sum(z, axis=0),
    "indicator_outer_sum": z.T @ z,
    "tokens": jnp.asarray(routing.num_tokens, jnp.float32),
  }


def cov_from_stats(stats: dict) -> jax.Array:
  """Covariance (biased) of the indicators from their sums: S_zz/T - m m^T."""
  tokens = jnp.maximum(stats["tokens"], 1.0)
  mean = stats["indicator_sum"] / tokens
  return stats["indicator_outer_sum"] / tokens - jnp.outer(mean, mean)


def update_mp_state(state, stats, cfg: RouterConfig):
  """The state-update protocol: one EMA step towards the covariance of the summed stats."""
  decay = cfg.settings["ema_decay"]
  cov = jax.lax.stop_gradient(state["cooc_cov"])
  return {"cooc_cov": decay * cov + (1 - decay) * cov_from_stats(stats)}


def init_mp_state(num_experts: int):
  return {"cooc_cov": jnp.zeros((num_experts, num_experts), jnp.float32)}


# model.moe.mahalanobis (configs saved before the section had flat mp_* keys).
SETTINGS = {"ema_decay": 0.99, "ridge": 1e-3}
LEGACY_KEYS = {"mp_ema_decay": "ema_decay", "mp_ridge": "ridge"}


def validate_keys(cfg: RouterConfig) -> None:
  """model.moe.mahalanobis: ema_decay in [0, 1), ridge > 0 (whatever the router)."""
  s = cfg.settings
  if not 0 <= s["ema_decay"] < 1:
    raise ConfigError(f"model.moe.mahalanobis.ema_decay={s['ema_decay']} must be in [0, 1)")
  if s["ridge"] <= 0:
    raise ConfigError(f"model.moe.mahalanobis.ridge={s['ridge']} must be > 0")


@register_router(
  "mahalanobis",
  init_state=init_mp_state,
  validate=validate_top_k,
  update_state=update_mp_state,
  settings=SETTINGS,
  legacy_keys=LEGACY_KEYS,
  validate_settings=validate_keys,
)
def route_mahalanobis(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  del rng
  num_experts = logits.shape[-1]
  probs = jax.nn.softmax(logits, axis=-1)
  cov = jax.lax.stop_gradient(state["cooc_cov"])
  metrics = {"routing_entropy": routing_entropy(probs)}
  if not train:
    routing, _ = softmax_top_k(logits, cfg.top_k, cfg.renormalize)
    return RouterOutput(routing, logits, probs, metrics, state)
  ridge = cfg.settings["ridge"]
  sigma = cov + ridge * jnp.eye(num_experts, dtype=jnp.float32)
  index, gains = greedy_mahalanobis(jax.lax.stop_gradient(probs), sigma, cfg.top_k)
  weight = jnp.take_along_axis(probs, index, axis=-1)
  if cfg.renormalize:
    weight = weight / jnp.sum(weight, axis=-1, keepdims=True)
  routing = Routing(index, weight, jnp.ones(index.shape, bool))
  stats = indicator_stats(routing, num_experts)
  _, topk_index = jax.lax.top_k(probs, cfg.top_k)
  same = jnp.mean(jnp.all(jnp.sort(index, 1) == jnp.sort(topk_index, 1), axis=1))
  metrics.update(
    {
      "mp_objective": jnp.mean(jnp.sum(gains, axis=-1)),
      "mp_topk_agreement": same.astype(jnp.float32),
    }
  )
  return RouterOutput(routing, logits, probs, metrics, update_mp_state(state, stats, cfg), stats)
