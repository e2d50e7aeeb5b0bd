"""EM for Gaussian mixtures with isotropic or diagonal covariances.

Dempster, Laird and Rubin (1977); notation of Bishop, PRML (2006) sec. 9.2:
responsibilities gamma_nk (eq. 9.23), M step (eqs. 9.24-9.26, the covariance
restricted to sigma_k^2 I or diag(sigma_k^2)), log-likelihood (eq. 9.28) and the
expected complete-data log-likelihood Q (eq. 9.40). Initial means are picked by
greedy k-means++ D^2 sampling (Arthur and Vassilvitskii 2007).

A mixture is a `GMM` whose `variances` are [K] (isotropic) or [K, d] (diagonal).
The steps are pure jax.numpy functions (jitted); they run in float32 unless
jax_enable_x64 is set. Choices no paper fixes: the initial variance (mean squared
distance to the nearest seed, the same for every component), the variance floor
and the greedy seeding's 2 + ln K candidates per step (as scikit-learn).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError

MIN_VARIANCE = 1e-6  # a floor on sigma^2 so that a component on one point stays finite


class GMM(NamedTuple):
  """Mixing weights pi [K], means mu [K, d], variances [K] or [K, d]."""

  weights: jax.Array | np.ndarray  # jax arrays, or host float64 ones (fedgem.py)
  means: jax.Array | np.ndarray
  variances: jax.Array | np.ndarray


def check_num_components(k: int, n: int) -> None:
  """Refuse K < 1 or K > n (n points cannot seed more than n components)."""
  if not 1 <= k <= n:
    raise ConfigError(f"number of mixture components K={k} must be in [1, n={n}]")


def per_dim_variances(variances: jax.Array | np.ndarray, dim: int) -> jax.Array | np.ndarray:
  """[K] isotropic or [K, d] diagonal variances as [K, d]."""
  return variances if variances.ndim == 2 else jnp.repeat(variances[:, None], dim, axis=1)


def log_joint(x: jax.Array, gmm: GMM) -> jax.Array:
  """[n, K] log pi_k + log N(x_n | mu_k, diag(sigma_k^2)) (PRML eq. 9.7 summand)."""
  var = per_dim_variances(gmm.variances, x.shape[-1])
  sq = jnp.sum((x[:, None, :] - gmm.means[None]) ** 2 / var[None], axis=-1)
  log_norm = jnp.sum(jnp.log(2 * jnp.pi * var), axis=-1)
  return jnp.log(gmm.weights)[None] - 0.5 * (sq + log_norm[None])


def e_step(x: jax.Array, gmm: GMM) -> tuple[jax.Array, jax.Array]:
  """Responsibilities gamma [n, K] (PRML eq. 9.23) and the log-likelihood at `gmm`."""
  joint = log_joint(x, gmm)
  per_point = jax.nn.logsumexp(joint, axis=1)
  return jnp.exp(joint - per_point[:, None]), jnp.sum(per_point)


def log_likelihood(x: jax.Array, gmm: GMM) -> jax.Array:
  """sum_n log sum_k pi_k N(x_n | mu_k, Sigma_k) (PRML eq. 9.28)."""
  return jnp.sum(jax.nn.logsumexp(log_joint(x, gmm), axis=1))


def q_function(x: jax.Array, resp: jax.Array, gmm: GMM) -> jax.Array:
  """Q(theta | theta_old) = sum_nk gamma_nk (log pi_k + log N(x_n | theta_k)) (PRML
  eq. 9.40), with gamma computed at theta_old; 0 log 0 counts as 0."""
  joint = log_joint(x, gmm)
  return jnp.sum(jnp.where(resp > 0, resp * joint, 0.0))


def component_variances(
  x: jax.Array, resp: jax.Array, means: jax.Array, diagonal: bool
) -> jax.Array:
  """argmax of Q over the variances at fixed means (PRML eq. 9.25, restricted):
  sigma_k^2 = sum_n gamma_nk ||x_n - mu_k||^2 / (d N_k), or per dimension."""
  counts = jnp.maximum(jnp.sum(resp, axis=0), jnp.finfo(x.dtype).tiny)
  per_dim = jnp.einsum("nk,nkd->kd", resp, (x[:, None, :] - means[None]) ** 2)
  per_dim = per_dim / counts[:, None]
  var = per_dim if diagonal else jnp.mean(per_dim, axis=-1)
  return jnp.maximum(var, MIN_VARIANCE)


def m_step(x: jax.Array, resp: jax.Array, old: GMM) -> GMM:
  """argmax_theta Q(theta | theta_old) (PRML eqs. 9.24-9.26); the covariance kind
  follows `old`. A component with no responsibility keeps its old mean and variance."""
  counts = jnp.sum(resp, axis=0)
  live = counts > 0
  safe = jnp.where(live, counts, 1.0)
  means = jnp.where(live[:, None], resp.T @ x / safe[:, None], old.means)
  variances = component_variances(x, resp, means, diagonal=old.variances.ndim == 2)
  live_var = live if old.variances.ndim == 1 else live[:, None]
  return GMM(
    weights=counts / x.shape[0],
    means=means,
    variances=jnp.where(live_var, variances, old.variances),
  )


@jax.jit
def em_step(x: jax.Array, gmm: GMM) -> tuple[GMM, jax.Array]:
  """One E step and one M step; returns the new mixture and the old one's log-likelihood."""
  resp, loglik = e_step(x, gmm)
  return m_step(x, resp, gmm), loglik


@jax.jit
def predict(x: jax.Array, gmm: GMM) -> jax.Array:
  """[n] the component of largest responsibility for each point."""
  return jnp.argmax(log_joint(x, gmm), axis=1)


def kmeans_plus_plus(x, k: int, seed, trials: int | None = None) -> np.ndarray:
  """[k, d] seeds drawn from the points by D^2 sampling (Arthur and Vassilvitskii 2007),
  greedy: each step draws `trials` candidates (default 2 + ln k, as scikit-learn) and
  keeps the one that lowers the potential most (trials=1: plain k-means++). `seed` is
  anything np.random.default_rng takes (an int or a list of ints)."""
  x = np.asarray(x, dtype=np.float64)
  check_num_components(k, x.shape[0])
  trials = trials or 2 + int(np.log(k))
  rng = np.random.default_rng(seed)
  chosen = [int(rng.integers(x.shape[0]))]
  nearest = np.sum((x - x[chosen[0]]) ** 2, axis=1)
  for _ in range(1, k):
    total = nearest.sum()
    # All points on the seeds already (duplicates): draw uniformly.
    probs = nearest / total if total > 0 else np.full(len(x), 1.0 / len(x))
    candidates = rng.choice(len(x), size=trials, p=probs)
    dists = np.minimum(nearest[None], np.sum((x[None] - x[candidates][:, None]) ** 2, -1))
    best = int(np.argmin(dists.sum(axis=1)))
    chosen.append(int(candidates[best]))
    nearest = dists[best]
  return x[chosen]


def init_gmm(x, k: int, *, seed, diagonal: bool = False) -> GMM:
  """k-means++ means, uniform weights, one shared variance: the mean squared distance
  of a point to its nearest seed, per dimension (a guess: no paper fixes it)."""
  x64 = np.asarray(x, dtype=np.float64)
  seeds = kmeans_plus_plus(x64, k, seed)
  sq = (x64[:, None, :] - seeds[None]) ** 2  # [n, k, d]
  nearest = sq[np.arange(len(x64)), np.argmin(sq.sum(-1), axis=1)]  # [n, d]
  per_dim = np.maximum(nearest.mean(axis=0), MIN_VARIANCE)
  variances = (
    np.tile(per_dim, (k, 1)) if diagonal else np.full(k, max(per_dim.mean(), MIN_VARIANCE))
  )
  dtype = jnp.asarray(x).dtype
  return GMM(
    weights=jnp.full(k, 1.0 / k, dtype),
    means=jnp.asarray(seeds, dtype),
    variances=jnp.asarray(variances, dtype),
  )


def fit(
  x,
  k: int,
  *,
  seed: int = 0,
  max_steps: int = 200,
  tol: float = 1e-6,
  diagonal: bool = False,
  init: GMM | None = None,
) -> tuple[GMM, np.ndarray]:
  """EM from `init` (default init_gmm(x, k, seed)) until the mean log-likelihood per
  point rises by less than `tol` (tol=0: exactly max_steps steps).

  Returns the mixture and the log-likelihood before each step and after the last."""
  x = jnp.asarray(x)
  check_num_components(k, x.shape[0])
  gmm = init if init is not None else init_gmm(x, k, seed=seed, diagonal=diagonal)
  history = []
  for _ in range(max_steps):
    gmm, loglik = em_step(x, gmm)
    history.append(float(loglik))
    if tol > 0 and len(history) > 1 and history[-1] - history[-2] < tol * x.shape[0]:
      break
  history.append(float(log_likelihood(x, gmm)))
  return gmm, np.asarray(history)
