"""Fitting and scoring mixtures on the sphere on one footing: MGFA, the vMF mixture
(moejax/mixtures/sphere.py) and a Euclidean GMM (moejax/mixtures/gmm.py).

A Euclidean GMM's density lives on R^d; restricted to S^{d-1} and renormalised there
(`restricted_gmm_log_likelihood`) it is a density w.r.t. the surface measure, as MGFA's
and the vMF mixture's are, so held-out log-likelihoods compare. `fit_best` keeps the
fit of largest training log-likelihood over restarts (k-means++ seeds), the same seeds
for every method.
"""

import numpy as np

from moejax.errors import ConfigError, choice_error
from moejax.mixtures import gmm, sphere

METHODS = ("mgfa", "vmf", "gmm_diag")


def fit_best(method: str, x, k: int, seeds, *, factors: int = 1, max_steps: int = 200, init=None):
  """(EM steps, model) of the fit of largest training log-likelihood over `seeds`.

  method: 'mgfa' (sphere.fit_mgfa with `factors` = q), 'vmf' (sphere.fit_vmf) or
  'gmm_diag' (gmm.fit, diagonal covariances, in the ambient coordinates). `init` (an
  MGFA or VMF, for those methods): one more candidate, EM started there (e.g. at the
  true parameters, so that the kept fit is the likelihood's maximum near the truth)."""
  if method not in METHODS:
    raise choice_error("method", method, METHODS)
  if not seeds and init is None:
    raise ConfigError(f"need at least one seed (seeds={list(seeds)})")
  if init is not None and method == "gmm_diag":
    raise ConfigError("init is for methods 'mgfa' and 'vmf' (method='gmm_diag')")
  fits = []
  model: gmm.GMM | sphere.VMF | sphere.MGFA
  for seed in [*seeds, *([None] if init is not None else [])]:
    start = {} if seed is None else {"seed": seed}
    if method == "gmm_diag":
      model, history = gmm.fit(x, k, seed=seed, diagonal=True, max_steps=max_steps)
    elif method == "vmf":
      model, history = sphere.fit_vmf(x, k, max_steps=max_steps, **(start or {"init": init}))
    else:
      model, history = sphere.fit_mgfa(
        x, k, factors, max_steps=max_steps, **(start or {"init": init})
      )
    fits.append((history[-1], len(history) - 1, model))
  best = max(range(len(fits)), key=lambda i: fits[i][0])
  return fits[best][1], fits[best][2]


def mean_direction_error(true_means, fitted_means) -> float:
  """The mean geodesic distance (rad) between true and fitted mean directions [K, d]
  under the matching of components that minimises it (all K! matchings), in float64."""
  import itertools

  true_means, fitted_means = (np.asarray(m, np.float64) for m in (true_means, fitted_means))
  if true_means.shape != fitted_means.shape or true_means.ndim != 2:
    raise ConfigError(
      f"need true and fitted means of one shape [K, d] (shapes "
      f"{true_means.shape}, {fitted_means.shape})"
    )

  def unit(m):
    return m / np.linalg.norm(m, axis=1, keepdims=True)

  t, f = unit(true_means), unit(fitted_means)
  cos = t @ f.T
  sin = np.linalg.norm(t[:, None] - cos[..., None] * f[None], axis=-1)
  dist = np.arctan2(sin, cos)  # [K true, K fitted]: exact at small angles, unlike arccos
  k = len(dist)
  return float(min(np.mean(dist[np.arange(k), list(p)]) for p in itertools.permutations(range(k))))


def held_out_log_likelihood(method: str, model, x, rng: np.random.Generator) -> float:
  """Mean log-likelihood per point of `x` w.r.t. the surface measure (a GMM restricted
  to the sphere: `restricted_gmm_log_likelihood`, which draws from `rng`)."""
  if method == "gmm_diag":
    return restricted_gmm_log_likelihood(x, model, rng)
  return sphere.log_likelihood(x, model) / len(x)


def gaussian_log_normalisers(
  means, variances, rng: np.random.Generator, samples: int = 4000
) -> np.ndarray:
  """[K] log Z_k, Z_k = the integral over S^{d-1} of N(x; m_k, diag(s_k^2)) dS (the mass
  a Euclidean Gaussian puts on the sphere, w.r.t. the surface measure), by importance
  sampling from the projected normal (x = y / |y|, y ~ N(m_k, diag s_k^2)), whose density
  on the sphere is int_0^inf r^{d-1} N(r x) dr (trapezoid quadrature around the mode):
    log w(x) = -(a - 2b)/2 - log int_0^inf r^{d-1} exp(-a r^2 / 2 + b r) dr,
    a = sum x^2 / s^2, b = sum x m / s^2.
  variances: [K] (isotropic) or [K, d]."""
  means = np.asarray(means, np.float64)
  variances = np.broadcast_to(
    np.asarray(variances, np.float64).reshape(len(means), -1), means.shape
  )
  d, out, u = means.shape[1], [], np.linspace(0.0, 1.0, 801)
  trapezoid = np.log(np.r_[0.5, np.ones(len(u) - 2), 0.5])
  for m, s2 in zip(means, variances):
    y = m + np.sqrt(s2) * rng.standard_normal((samples, d))
    x = y / np.linalg.norm(y, axis=1, keepdims=True)
    a, b = np.sum(x * x / s2, 1), np.sum(x * m / s2, 1)
    mode = (b + np.sqrt(b * b + 4 * a * (d - 1))) / (2 * a)
    width = 1 / np.sqrt(a + (d - 1) / mode**2)
    lo, hi = np.maximum(mode - 14 * width, 0.0), mode + 14 * width
    r = lo[:, None] + (hi - lo)[:, None] * u[None]
    with np.errstate(divide="ignore"):
      f = (d - 1) * np.log(r) - a[:, None] * r * r / 2 + b[:, None] * r
    log_integral = np.logaddexp.reduce(f + trapezoid, axis=1) + np.log((hi - lo) / (len(u) - 1))
    out.append(np.logaddexp.reduce(-(a - 2 * b) / 2 - log_integral) - np.log(samples))
  return np.asarray(out)


def restricted_gmm_log_likelihood(x, model: gmm.GMM, rng: np.random.Generator) -> float:
  """Mean log-likelihood per point of a Euclidean GMM restricted to the sphere and
  renormalised there (`gaussian_log_normalisers`), w.r.t. the surface measure: comparable
  with `sphere.log_likelihood(x, mgfa_or_vmf) / n`."""
  x = sphere.checked_points(x)
  joint = np.asarray(gmm.log_joint(x, model), np.float64)
  log_z = gaussian_log_normalisers(model.means, model.variances, rng)
  log_mass = np.logaddexp.reduce(np.log(np.asarray(model.weights, np.float64)) + log_z)
  return float(np.mean(np.logaddexp.reduce(joint, axis=1)) - log_mass)
