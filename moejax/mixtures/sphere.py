"""Mixtures on the unit sphere S^{d-1}: MGFA and a vMF mixture.

MGFA, mixtures of geodesic factor analysers (ICML 2026; abstract only, so GUESSED from
its priors PPGA, Zhang and Fletcher NeurIPS 2013, and MPPGA): component k is a mean
direction mu_k and a factor analyser (Tipping and Bishop 1999) in the tangent space:
  x = Exp_mu_k(v),  v = W_k z + eps,  z ~ N(0, I_q),  eps ~ N(0, sigma_k^2 I_{d-1}),
W_k [d, q] orthogonal to mu_k (tangent vectors in ambient coordinates). PPGA puts a
Riemannian normal around Exp_mu(W z) and needs Monte Carlo EM; noise in the tangent
space gives a closed form. Density on the sphere (approximation): the tangent Gaussian
pushed forward by Exp on |v| < pi, Jacobian included,
  p_k(x) = N_{d-1}(Log_mu_k x; 0, W W^T + sigma^2 I) / (sin r / r)^{d-2},  r = d(mu_k, x);
the mass beyond the cut locus is dropped (p_k integrates to P(|v| < pi) <= 1).
EM (GUESS): exact E step; the M step sets pi_k, takes the weighted Frechet mean as
candidate mu_k, fits ML PPCA (Tipping and Bishop eqs. 7-8) to Log_mu(x) at it and at
the old mu_k and keeps the larger Q_k: generalised EM (Dempster et al. 1977), so the
likelihood never falls. Initial means: k-means++ in the chordal metric, W = 0.

vMF mixture (Banerjee et al., JMLR 2005): p_k(x) = C_d(kappa_k) exp(kappa_k mu_k^T x),
C_d = kappa^{d/2-1} / ((2 pi)^{d/2} I_{d/2-1}(kappa)) via scipy.special.ive (imported
when needed: scipy is no declared dependency); mu_k = r_k / |r_k|, kappa_k ~ (rbar d -
rbar^3) / (1 - rbar^2) (their sec. 4), optionally Newton-refined (Sra 2012), kept only
where it raises Q_k. Both EMs run in x's dtype.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError
from moejax.mixtures import gmm

ON_SPHERE_TOL = 1e-5  # | ||x|| - 1 | above this is refused
MIN_VARIANCE = 1e-8  # a floor on sigma_k^2
MAX_KAPPA = 1e6  # a cap on kappa_k (all points of a component identical)
FRECHET_STEPS = 50  # Karcher iterations per M step, warm-started at the old mean


def exp_map(mu: jax.Array, v: jax.Array) -> jax.Array:
  """Exp_mu(v) = cos|v| mu + sin|v| v / |v| for v tangent at mu ([..., d], broadcast)."""
  r = jnp.linalg.norm(v, axis=-1, keepdims=True)
  return jnp.cos(r) * mu + jnp.sinc(r / jnp.pi) * v  # jnp.sinc(t) = sin(pi t) / (pi t)


def log_map(mu: jax.Array, x: jax.Array) -> jax.Array:
  """Log_mu(x) = theta u / |u|, u = x - <x, mu> mu, theta = atan2(|u|, <x, mu>) (the
  geodesic distance). Tangent at mu, |Log| <= pi; 0 at the antipode (cut locus)."""
  c = jnp.sum(mu * x, axis=-1, keepdims=True)
  u = x - c * mu
  u = u - jnp.sum(u * mu, axis=-1, keepdims=True) * mu  # again: tangent near the antipode
  s = jnp.linalg.norm(u, axis=-1, keepdims=True)
  return jnp.where(s > 0, jnp.arctan2(s, c) / jnp.where(s > 0, s, 1.0), 1.0) * u


def geodesic_distance(x: jax.Array, y: jax.Array) -> jax.Array:
  """[...] the great-circle distance |Log_y x| in [0, pi]."""
  return jnp.linalg.norm(log_map(y, x), axis=-1)


@functools.partial(jax.jit, static_argnames=("steps",))
def _karcher(x, weights, init, steps):
  """Riemannian gradient descent, unit step, on (1/2) sum_n w_n d(m, x_n)^2 (sum w = 1):
  m <- Exp_m(sum_n w_n Log_m x_n) (Karcher 1977; Afsari 2011)."""

  def body(state):
    m, i, _ = state
    g = weights @ log_map(m, x)
    m = exp_map(m, g)
    return m / jnp.linalg.norm(m), i + 1, jnp.linalg.norm(g)

  tol = 32 * jnp.finfo(x.dtype).eps
  state = (init, jnp.int32(0), jnp.asarray(jnp.inf, x.dtype))
  return jax.lax.while_loop(lambda s: (s[1] < steps) & (s[2] > tol), body, state)[0]


def frechet_mean(x, weights=None, *, init=None, steps: int = 200) -> jax.Array:
  """argmin_m sum_n w_n d(m, x_n)^2 by at most `steps` Karcher iterations: [d], or [K, d]
  for weights [K, n]; from `init` (default: the normalised weighted Euclidean mean). A
  stationary point; the unique minimum for points in a ball of radius < pi/2 (Afsari 2011)."""
  x = checked_points(x)
  w = jnp.ones(x.shape[0], x.dtype) if weights is None else jnp.asarray(weights, x.dtype)
  if (
    w.shape[-1:] != x.shape[:1]
    or w.ndim > 2
    or bool(jnp.any(w < 0))
    or bool(jnp.any(jnp.sum(w, -1) <= 0))
  ):
    raise ConfigError(
      f"weights must be [n={x.shape[0]}] or [K, n], non-negative with a "
      f"positive sum (weights.shape={tuple(w.shape)})"
    )
  w = w / jnp.sum(w, -1, keepdims=True)
  if init is None:
    norm = jnp.linalg.norm(w @ x, axis=-1, keepdims=True)
    if bool(jnp.any(norm < 1e-6)):
      raise ConfigError(
        f"the weighted Euclidean mean is ~0, so there is no default start; "
        f"give init (|mean|={float(jnp.min(norm)):.3g})"
      )
    init = (w @ x) / norm
  elif jnp.shape(init) not in ((x.shape[1],), w.shape[:-1] + x.shape[1:]):
    raise ConfigError(f"init must be [d={x.shape[1]}] or [K, d] (init.shape={jnp.shape(init)})")
  init = jnp.asarray(init, x.dtype)
  checked_points(init.reshape(-1, x.shape[1]))
  init = jnp.broadcast_to(init, w.shape[:-1] + x.shape[1:])

  def run(wk, mk):
    return _karcher(x, wk, mk, steps)

  return run(w, init) if w.ndim == 1 else jax.vmap(run)(w, init)


# ---- MGFA ---------------------------------------------------------------------------


class MGFA(NamedTuple):
  """Weights pi [K], mean directions mu [K, d], factors W [K, d, q], noise sigma^2 [K]."""

  weights: jax.Array
  means: jax.Array
  factors: jax.Array
  noise: jax.Array


def tangent_log_density(v: jax.Array, factors: jax.Array, noise) -> jax.Array:
  """[n] log N_{d-1}(v; 0, C = W W^T + sigma^2 I) on the (d-1)-dim tangent space (v [n, d],
  W [d, q] tangent), by Woodbury with M = sigma^2 I_q + W^T W = L L^T (Tipping and Bishop
  sec. 3): v^T C^-1 v = (|v|^2 - |L^-1 W^T v|^2) / sigma^2, det C = sigma^{2(d-1-q)} det M."""
  d, q = factors.shape
  chol = jnp.linalg.cholesky(noise * jnp.eye(q, dtype=v.dtype) + factors.T @ factors)
  proj = jax.scipy.linalg.solve_triangular(chol, (v @ factors).T, lower=True)  # [q, n]
  quad = (jnp.sum(v * v, -1) - jnp.sum(proj * proj, 0)) / noise
  logdet = (d - 1 - q) * jnp.log(noise) + 2 * jnp.sum(jnp.log(jnp.diag(chol)))
  return -0.5 * ((d - 1) * jnp.log(2 * jnp.pi) + logdet + quad)


def component_log_density(x, mean, factors, noise) -> jax.Array:
  """[n] log p_k(x) on the sphere (module docstring): the tangent density minus
  log det dExp = (d-2) log(sin r / r), floored near r = pi."""
  v = log_map(mean, x)
  sinc = jnp.sinc(jnp.linalg.norm(v, axis=-1) / jnp.pi)
  log_jacobian = (x.shape[-1] - 2) * jnp.log(jnp.maximum(sinc, jnp.finfo(x.dtype).tiny))
  return tangent_log_density(v, factors, noise) - log_jacobian


def _ppca(x, gamma, mean, q):
  """ML PPCA of Log_mean(x) weighted by gamma (Tipping and Bishop eqs. 7-8, zero mean):
  S = sum_n g_n v_n v_n^T / N, sigma^2 = (tr S - top-q eigenvalues) / (d-1-q),
  W = U_q (L_q - sigma^2)^{1/2}. Returns (W, sigma^2, Q_k = sum_n g_n log p_k(x_n))."""
  v = log_map(mean, x)
  s = (gamma[:, None] * v).T @ v / jnp.maximum(jnp.sum(gamma), jnp.finfo(x.dtype).tiny)
  lam, vec = jnp.linalg.eigh(s)  # ascending; `mean` is a null eigenvector
  top, basis = lam[::-1][:q], vec[:, ::-1][:, :q]
  noise = jnp.maximum((jnp.trace(s) - jnp.sum(top)) / (x.shape[-1] - 1 - q), MIN_VARIANCE)
  basis = basis - mean[:, None] * (mean @ basis)[None]  # keep the columns tangent
  factors = basis * jnp.sqrt(jnp.maximum(top - noise, 0.0))[None]
  return factors, noise, jnp.sum(gamma * component_log_density(x, mean, factors, noise))


def _mgfa_component_m_step(x, gamma, mean, factors, noise):
  count = jnp.sum(gamma)
  candidate = _karcher(x, gamma / jnp.where(count > 0, count, 1.0), mean, FRECHET_STEPS)
  w_old, s_old, q_old = _ppca(x, gamma, mean, factors.shape[-1])
  w_new, s_new, q_new = _ppca(x, gamma, candidate, factors.shape[-1])

  def pick(a, b, old):
    return jnp.where(count > 0, jnp.where(q_new >= q_old, a, b), old)

  return pick(candidate, mean, mean), pick(w_new, w_old, factors), pick(s_new, s_old, noise)


def mgfa_m_step(x: jax.Array, resp: jax.Array, old: MGFA) -> MGFA:
  """The generalised M step (module docstring): Q(new | old) >= Q(old | old). A component
  with no responsibility keeps its parameters."""
  means, factors, noise = jax.vmap(_mgfa_component_m_step, (None, 1, 0, 0, 0))(
    x, resp, old.means, old.factors, old.noise
  )
  return MGFA(jnp.sum(resp, 0) / x.shape[0], means, factors, noise)


def init_mgfa(x, k: int, q: int, *, seed=0) -> MGFA:
  """k-means++ means (chordal D^2 sampling), W = 0, uniform weights, one noise variance:
  the mean squared geodesic distance to the nearest seed over d-1 (GUESS)."""
  x = checked_points(x)
  d = x.shape[1]
  if not 0 <= q <= d - 2:
    raise ConfigError(
      f"number of factors q={q} must be in [0, d-2={d - 2}] (d-1={d - 1} "
      "tangent dimensions, one at least for the noise)"
    )
  seeds = jnp.asarray(gmm.kmeans_plus_plus(x, k, seed), x.dtype)
  sq = jnp.mean(jnp.min(geodesic_distance(x[:, None], seeds[None]), 1) ** 2)
  return MGFA(
    jnp.full(k, 1.0 / k, x.dtype),
    seeds,
    jnp.zeros((k, d, q), x.dtype),
    jnp.full(k, jnp.maximum(sq / (d - 1), MIN_VARIANCE), x.dtype),
  )


@jax.jit
def _mgfa_em_step(x, model):
  resp, loglik = e_step(x, model)
  return mgfa_m_step(x, resp, model), loglik


def fit_mgfa(
  x, k: int, q: int, *, seed=0, max_steps: int = 200, tol: float = 1e-6, init: MGFA | None = None
) -> tuple[MGFA, np.ndarray]:
  """EM from `init` (default init_mgfa) until the mean log-likelihood per point rises by
  less than `tol` (0: max_steps steps). Returns the model and the log-likelihood before
  each step and after the last (never decreasing, up to rounding)."""
  x = checked_points(x)
  gmm.check_num_components(k, x.shape[0])
  model = init if init is not None else init_mgfa(x, k, q, seed=seed)
  return _em(x, model, _mgfa_em_step, max_steps, tol)


# ---- vMF mixture --------------------------------------------------------------------


class VMF(NamedTuple):
  """Weights [K], mean directions [K, d], concentrations kappa [K], log C_d(kappa) [K]."""

  weights: jax.Array
  means: jax.Array
  kappas: jax.Array
  log_normalisers: jax.Array


def log_vmf_normaliser(kappa, d: int) -> np.ndarray:
  """log C_d(kappa) in float64 via log I_nu(kappa) = log ive(nu, kappa) + kappa; at
  kappa = 0, the uniform density's log Gamma(d/2) - log 2 - (d/2) log pi."""
  from scipy import special  # pylint: disable=g-import-not-at-top

  kappa = np.asarray(kappa, np.float64)
  nu, safe = d / 2 - 1, np.maximum(kappa, 1e-300)
  with np.errstate(divide="ignore"):  # ive underflows to 0 at tiny kappa: not used there
    log_c = nu * np.log(safe) - d / 2 * np.log(2 * np.pi) - np.log(special.ive(nu, safe)) - safe
  uniform = special.gammaln(d / 2) - np.log(2) - d / 2 * np.log(np.pi)
  return np.where(kappa > 1e-30, log_c, uniform)


def vmf_mixture(weights, means, kappas) -> VMF:
  """A VMF (in the dtype of `means`) with its log-normalisers."""
  means = jnp.asarray(means)
  return VMF(
    jnp.asarray(weights, means.dtype),
    means,
    jnp.asarray(kappas, means.dtype),
    jnp.asarray(log_vmf_normaliser(kappas, means.shape[-1]), means.dtype),
  )


def banerjee_kappa(rbar, d: int, newton_steps: int = 0) -> np.ndarray:
  """kappa ~ (rbar d - rbar^3) / (1 - rbar^2) (Banerjee et al. sec. 4), then Newton steps
  on A_d(kappa) = I_{d/2} / I_{d/2-1} = rbar (Sra 2012); in [0, MAX_KAPPA]."""
  from scipy import special  # pylint: disable=g-import-not-at-top

  r = np.clip(np.asarray(rbar, np.float64), 0.0, 1 - 1e-12)
  kappa = np.minimum(r * (d - r * r) / (1 - r * r), MAX_KAPPA)
  for _ in range(newton_steps):
    a = special.ive(d / 2, kappa) / special.ive(d / 2 - 1, kappa)
    slope = 1 - a * a - (d - 1) / np.maximum(kappa, 1e-12) * a  # A_d'(kappa)
    kappa = np.clip(kappa - (a - r) / np.maximum(slope, 1e-12), 0.0, MAX_KAPPA)
  return kappa


def vmf_m_step(x: jax.Array, resp: jax.Array, old: VMF, newton_steps: int = 0) -> VMF:
  """mu_k = r_k / |r_k| (r_k = sum_n gamma_nk x_n); kappa_k from rbar_k = |r_k| / N_k,
  kept only where Q_k = N_k (log C_d(kappa) + kappa rbar_k) is at least the old kappa's."""
  counts, sums = jnp.sum(resp, 0), resp.T @ x
  norms = jnp.linalg.norm(sums, axis=-1)
  means = jnp.where(norms[:, None] > 0, sums / jnp.maximum(norms, 1e-30)[:, None], old.means)
  rbar = np.asarray(norms / jnp.maximum(counts, jnp.finfo(x.dtype).tiny), np.float64)
  d, prev = x.shape[-1], np.asarray(old.kappas, np.float64)
  new = banerjee_kappa(rbar, d, newton_steps)

  def q(kappa):
    return log_vmf_normaliser(kappa, d) + kappa * rbar

  better = (q(new) >= q(prev)) & (np.asarray(counts) > 0)
  return vmf_mixture(counts / x.shape[0], means, np.where(better, new, prev))


def init_vmf(x, k: int, *, seed=0) -> VMF:
  """k-means++ means (as init_mgfa), uniform weights, one kappa from the mean cosine
  to the nearest seed."""
  x = checked_points(x)
  seeds = jnp.asarray(gmm.kmeans_plus_plus(x, k, seed), x.dtype)
  kappa = banerjee_kappa(float(jnp.mean(jnp.max(x @ seeds.T, axis=1))), x.shape[1])
  return vmf_mixture(np.full(k, 1.0 / k), seeds, np.full(k, kappa))


def fit_vmf(
  x,
  k: int,
  *,
  seed=0,
  max_steps: int = 200,
  tol: float = 1e-6,
  newton_steps: int = 0,
  init: VMF | None = None,
) -> tuple[VMF, np.ndarray]:
  """EM for the vMF mixture; stopping rule and history as fit_mgfa."""
  x = checked_points(x)
  gmm.check_num_components(k, x.shape[0])

  def step(x, model):
    resp, loglik = e_step(x, model)
    return vmf_m_step(x, resp, model, newton_steps), loglik

  return _em(x, init if init is not None else init_vmf(x, k, seed=seed), step, max_steps, tol)


# ---- shared: E step, likelihood, prediction, ARI, checks ------------------------------


@jax.jit
def log_joint(x: jax.Array, model: MGFA | VMF) -> jax.Array:
  """[n, K] log pi_k + log p_k(x_n), densities w.r.t. the surface measure of the sphere."""
  if isinstance(model, VMF):
    return jnp.log(model.weights) + model.log_normalisers + model.kappas * (x @ model.means.T)
  return jnp.log(model.weights) + jax.vmap(component_log_density, (None, 0, 0, 0), 1)(
    x, model.means, model.factors, model.noise
  )


def e_step(x, model) -> tuple[jax.Array, jax.Array]:
  """Responsibilities [n, K] and the log-likelihood sum_n log sum_k pi_k p_k(x_n)."""
  joint = log_joint(x, model)
  per_point = jax.nn.logsumexp(joint, axis=1)
  return jnp.exp(joint - per_point[:, None]), jnp.sum(per_point)


def log_likelihood(x, model: MGFA | VMF) -> float:
  """sum_n log p(x_n) of (held-out) points on the sphere."""
  return float(e_step(checked_points(x), model)[1])


def predict(x, model: MGFA | VMF) -> np.ndarray:
  """[n] the component of largest responsibility."""
  return np.asarray(jnp.argmax(log_joint(checked_points(x), model), axis=1))


def _em(x, model, step, max_steps, tol):
  if int(max_steps) != max_steps or max_steps < 1:
    raise ConfigError(f"max_steps must be an integer >= 1 (max_steps={max_steps})")
  history = []
  for _ in range(max_steps):
    model, loglik = step(x, model)
    history.append(float(loglik))
    if tol > 0 and len(history) > 1 and history[-1] - history[-2] < tol * x.shape[0]:
      break
  history.append(float(e_step(x, model)[1]))
  return model, np.asarray(history)


def checked_points(x) -> jax.Array:
  """x as a [n, d] float array (d >= 2) of unit vectors; ConfigError names the first bad row."""
  arr = np.asarray(x)
  if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] < 2:
    raise ConfigError(f"points must be a non-empty [n, d >= 2] array (x.shape={arr.shape})")
  bad = np.flatnonzero(
    ~(np.abs(np.linalg.norm(arr.astype(np.float64), axis=1) - 1) <= ON_SPHERE_TOL)
  )  # NaN counts as off
  if bad.size:
    i = int(bad[0])
    raise ConfigError(
      f"points must lie on the unit sphere, | ||x|| - 1 | <= {ON_SPHERE_TOL:g} "
      f"(first bad row {i}: ||x[{i}]||={np.linalg.norm(arr[i]):.6g})"
    )
  return (
    jnp.asarray(x)
    if np.issubdtype(arr.dtype, np.floating)
    else jnp.asarray(arr, jnp.result_type(float))
  )
