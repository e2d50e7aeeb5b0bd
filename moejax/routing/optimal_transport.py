"""As-COOT routing (TiME, ICML 2026): semi-relaxed entropic optimal transport between
the tokens of a batch and the experts.

Only the abstract was available; the mechanism is reconstructed (guess) from
COOT (Redko et al. 2020) and semi-relaxed / unbalanced Sinkhorn
(Chizat et al. 2018):
    min_pi <C, pi> - eps H(pi) + tau KL(pi 1 | a)   s.t.  pi^T 1 = b,
with cost C = -logits (token-expert affinity), a = 1/T per token (relaxed) and
b = 1/E per expert (hard: every expert receives the same transport mass, the
load-balance constraint). Scaling iterations in log space, K = exp(-C / eps):
    u = (a / K v)^(tau / (tau + eps)),   v = b / (K^T u),
ending with the v step so the expert marginals are exact. tau = inf
(`as_coot.tau = 0` here) gives the balanced Sinkhorn (u = a / K v); a finite tau
lets a token whose affinities are all poor carry less than a_t mass.
Slots are filled in k rounds: round j solves the transport above with each
token's experts of rounds < j masked out (cost +inf) and gives each token the
argmax of its row of pi, i.e. of logits / eps + log v (a per-expert offset
that pushes tokens off crowded experts), so every round is balanced on its
own. (Our choice: the top-k of a single plan is balanced only in its first
slot - on the trained default LM, k=2, one plan gave max/mean load 2.06, as
near-one-hot rows leave the second choice to the raw logits.) k = 1 is one
plan. Combine weights are the softmax probabilities of the chosen experts
(renormalised when `renormalize`), so only the selection changes. The same
function runs in training and at test time (the paper's use is test time).

Settings (model.moe.as_coot): epsilon (0.05), tau (1.0; 0 = infinity),
iters (50, scaling iterations per plan).

NON-CAUSAL: pi couples all tokens of the call (like expert choice): do not use
it to train an autoregressive LM without care.

Skipped: COOT's joint feature-space coupling and the paper's bidirectional
(InfoNCE) contrastive alignment at test time; only the semi-relaxed transport
routing is implemented.
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
from moejax.routing.topk import validate_top_k


def semi_relaxed_sinkhorn(
  scores: jax.Array,
  epsilon: float,
  tau: float | None,
  num_iters: int,
  allowed: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Transport plan with exact expert marginals 1/E and KL-relaxed token marginals.

  scores [T, E] (affinity, cost = -scores). tau None or <= 0 means balanced
  Sinkhorn. allowed bool [T, E]: pairs outside it get no mass (cost +inf).
  Returns (log_pi [T, E], log_u [T], log_v [E]).
  """
  num_tokens, num_experts = scores.shape
  log_k = scores.astype(jnp.float32) / epsilon
  if allowed is not None:
    log_k = jnp.where(allowed, log_k, -jnp.inf)
  log_a = -jnp.log(jnp.float32(num_tokens))
  log_b = -jnp.log(jnp.float32(num_experts))
  power = 1.0 if tau is None or tau <= 0 else tau / (tau + epsilon)

  def v_step(log_u):  # an expert no allowed token can reach keeps log_v = 0
    lse = jax.nn.logsumexp(log_k + log_u[:, None], axis=0)
    return jnp.where(jnp.isneginf(lse), 0.0, log_b - lse)

  def body(_, log_v):
    log_u = power * (log_a - jax.nn.logsumexp(log_k + log_v[None, :], axis=1))
    return v_step(log_u)

  log_v = jax.lax.fori_loop(0, num_iters, body, jnp.zeros((num_experts,), jnp.float32))
  log_u = power * (log_a - jax.nn.logsumexp(log_k + log_v[None, :], axis=1))
  log_v = v_step(log_u)
  return log_u[:, None] + log_k + log_v[None, :], log_u, log_v


# model.moe.as_coot (configs saved before the section had flat ot_* keys).
SETTINGS = {"epsilon": 0.05, "tau": 1.0, "iters": 50}
LEGACY_KEYS = {"ot_epsilon": "epsilon", "ot_tau": "tau", "ot_iters": "iters"}


def validate_keys(cfg: RouterConfig) -> None:
  """model.moe.as_coot: epsilon > 0, iters >= 1, tau >= 0 (whatever the router)."""
  s = cfg.settings
  if s["epsilon"] <= 0:
    raise ConfigError(f"model.moe.as_coot.epsilon={s['epsilon']} must be > 0")
  if s["iters"] < 1:
    raise ConfigError(f"model.moe.as_coot.iters={s['iters']} must be >= 1")
  if s["tau"] < 0:
    raise ConfigError(
      f"model.moe.as_coot.tau={s['tau']} must be >= 0 (0 = balanced Sinkhorn, tau = infinity)"
    )


@register_router(
  "as_coot",
  causal=False,
  validate=validate_top_k,
  promises={"weights_proportional_to_probs"},
  settings=SETTINGS,
  legacy_keys=LEGACY_KEYS,
  validate_settings=validate_keys,
)
def route_as_coot(
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
  scores, chosen, slots, plans = (
    jax.lax.stop_gradient(logits),
    jnp.zeros(logits.shape, bool),
    [],
    [],
  )
  for _ in range(cfg.top_k):  # one balanced plan per slot (module doc)
    log_pi, _, _ = semi_relaxed_sinkhorn(
      scores, s["epsilon"], s["tau"], s["iters"], allowed=~chosen
    )
    plans.append(log_pi)
    slots.append(jnp.argmax(log_pi, axis=-1))
    chosen = chosen | jax.nn.one_hot(slots[-1], logits.shape[-1], dtype=bool)
  index = jnp.stack(slots, axis=-1).astype(jnp.int32)
  weight = jnp.take_along_axis(probs, index, axis=-1)
  if cfg.renormalize:
    weight = weight / jnp.sum(weight, axis=-1, keepdims=True)
  routing = Routing(index, weight, jnp.ones(index.shape, bool))
  row_mass = jnp.exp(jax.nn.logsumexp(plans[0], axis=1))  # the first (unmasked) plan
  metrics = {
    "routing_entropy": routing_entropy(probs),
    "ot_token_mass_min": jnp.min(row_mass) * logits.shape[0],
  }
  return RouterOutput(routing, logits, probs, metrics, state)
