"""Dirichlet-Prior Shaping Loss, DPSL (Mirvakhabova et al., arXiv 2510.01185).

Target: every token's routing distribution p_t in the simplex is a draw from
Dir(alpha). Then each coordinate has the Beta marginal
    p_te ~ Beta(alpha_e, A - alpha_e),   A = sum_e alpha_e,
and the probability-integral transform u_te = F_Beta(p_te) is Uniform(0, 1).
DPSL matches, per expert, the empirical distribution of the router's
probabilities to that Beta marginal. Here the distance is the
Cramer-von Mises form over the sorted PIT values of each expert column:
    L = sum_e (1/T) sum_i (u_(i),e - (i - 1/2)/T)^2,
which is (omega^2 - 1/(12 T)) / T per expert: about 1/(6T) per expert for rows
that really are Dir(alpha) draws, and O(1) when every row is uniform. The
paper (and its reviews) describe "the distance between the empirical CDF and
the target Beta CDF for each expert"; the exact distance (CvM vs a quantile or
KS form) is our choice, marked as a guess.

Priors:
  symmetric   alpha: scalar   (alpha < 1: confident, balanced routing)
  asymmetric  alpha: [E]      (per-expert preference)
  per token   alpha: [T, E]   (e.g. per modality / task: a token of modality m
                               gets the prior row of m). Each token then has its
                               own Beta marginal; the PIT values are still
                               Uniform(0, 1) under the target, so they are sorted
                               and compared exactly as above.
The gradient flows through the Beta CDF (jax.scipy.special.betainc is
differentiable in x) and the sort (a permutation).

Registered loss "dpsl": the prior is the router's own if it reports one in
`out.metrics["dpsl_alpha"]` (scalar, [E] or [T, E], e.g. per-task priors),
else the symmetric `model.moe.losses.dpsl.alpha` (default DEFAULT_ALPHA = 1.0,
the paper's Qwen2 setting; 0.75 was better for Llama3.2). Configs saved before
that section had the flat key model.moe.dpsl_alpha (migrated on load). It is a
statistic of the whole call's tokens (each token's rank among them), so
gradient accumulation with train.balance_statistics='step' refuses it
(moejax/losses/base.py).
"""

import jax
import jax.numpy as jnp
from jax.scipy.special import betainc

from moejax.errors import ConfigError
from moejax.losses.base import LossConfig, register_loss
from moejax.registry import Settings
from moejax.assignment.routing import RouterOutput, Routing

DEFAULT_ALPHA = 1.0
_EPS = 1e-6


def beta_marginals(alpha: jax.Array, num_experts: int) -> tuple[jax.Array, jax.Array]:
  """(a, b) of the Beta marginals of Dir(alpha); alpha scalar, [E] or [T, E]."""
  alpha = jnp.asarray(alpha, jnp.float32)
  if alpha.ndim == 0:
    alpha = jnp.full((num_experts,), alpha)
  return alpha, jnp.sum(alpha, axis=-1, keepdims=True) - alpha


def pit_values(probs: jax.Array, alpha) -> jax.Array:
  """u[t, e] = F_Beta(alpha_e, A - alpha_e)(probs[t, e]), float32 [T, E]."""
  a, b = beta_marginals(alpha, probs.shape[-1])
  p = jnp.clip(probs.astype(jnp.float32), _EPS, 1.0 - _EPS)
  return betainc(a, b, p)


def dpsl_loss(probs: jax.Array, alpha=DEFAULT_ALPHA) -> jax.Array:
  """Cramer-von Mises distance of each expert's PIT values to Uniform, summed over experts."""
  u = jnp.sort(pit_values(probs, alpha), axis=0)
  num_tokens = probs.shape[0]
  target = (jnp.arange(num_tokens, dtype=jnp.float32) + 0.5) / num_tokens
  return jnp.sum(jnp.mean(jnp.square(u - target[:, None]), axis=0))


def ks_statistics(probs: jax.Array, alpha=DEFAULT_ALPHA) -> jax.Array:
  """Kolmogorov-Smirnov statistic of each expert column against its Beta marginal, [E]."""
  u = jnp.sort(pit_values(probs, alpha), axis=0)
  n = probs.shape[0]
  i = jnp.arange(1, n + 1, dtype=jnp.float32)[:, None]
  return jnp.max(jnp.maximum(i / n - u, u - (i - 1) / n), axis=0)


def dpsl_example():
  """E = 2, alpha = 1: Beta(1, 1) is Uniform, so u = p. probs [0.3, 0.7] and
  [0.6, 0.4]: sorted columns (0.3, 0.6) and (0.4, 0.7) against targets
  (0.25, 0.75) give (0.05^2 + 0.15^2) / 2 = 0.0125 each, 0.025 in all."""
  probs = jnp.asarray([[0.3, 0.7], [0.6, 0.4]], jnp.float32)
  routing = Routing(jnp.asarray([[1], [0]], jnp.int32), jnp.ones((2, 1)), jnp.ones((2, 1), bool))
  out = RouterOutput(routing, jnp.log(probs), probs, {}, {})
  return out, LossConfig(Settings({"alpha": 1.0})), 0.025


def validate_keys(cfg: LossConfig) -> None:
  """model.moe.losses.dpsl: alpha > 0 (whatever the losses in use)."""
  alpha = cfg.settings["alpha"]
  if not alpha > 0:
    raise ConfigError(f"model.moe.losses.dpsl.alpha={alpha} must be > 0")


@register_loss(
  "dpsl",
  example=dpsl_example,
  settings={"alpha": DEFAULT_ALPHA},
  legacy_keys={"dpsl_alpha": "alpha"},
  validate_settings=validate_keys,
  batch_statistic="it compares each expert's empirical distribution over the "
  "tokens of a call (sorted ranks), which no sums over "
  "micro-batches reproduce",
)
def dpsl(out: RouterOutput, cfg: LossConfig) -> jax.Array:
  """DPSL with the router's prior if it reports one, else model.moe.losses.dpsl.alpha
  (cfg.settings)."""
  default = cfg.settings["alpha"]
  return dpsl_loss(out.over_experts("probs"), out.metrics.get("dpsl_alpha", default))
