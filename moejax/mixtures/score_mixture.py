r"""MoLR-MoG (arXiv 2601.01475, ICLR 2026): mixture-of-experts
score networks for data on a union of low-rank subspaces, each subspace carrying a
latent Gaussian mixture. No code was published; guesses are marked GUESS.

Data: subspace k with probability alpha_k, x = U_k z, U_k [D, d] orthonormal,
z ~ sum_l pi_kl N(mu_kl, S_kl). GUESS: every subspace has the same d and L = n_k
(stacked arrays; the paper lets them vary); the sampler's latent covariance is I (the
spec's guess). Noising is variance exploding, x_t = x + sigma eps; VP (x_t = m x + s
eps) is the same after x_t / m with sigma = s / m, its score score_VE(x_t / m) / m.

p_t is a Gaussian mixture in R^D, component (k, l) = N(U_k mu_kl, U_k S_kl U_k^T +
sigma^2 I). With y = U_k^T x and C = S_kl + sigma^2 I_d (Woodbury, U orthonormal):
  log N = -1/2 [(y-mu)^T C^-1 (y-mu) + log|C| + |x-U y|^2/sigma^2 + (D-d) log sigma^2
                + D log 2 pi],
  score = sum_kl w_kl(x) [-U_k C^-1 (y - mu_kl) - (x - U_k y) / sigma^2]
(the spec's eq. with m = 1), w the posterior softmax: a gate over subspaces, inside
each the latent-MoG score plus the orthogonal-complement term.

The score networks and their training: moejax/mixtures/score_networks.py.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError


class MoLRMoG(NamedTuple):
  """Subspace weights alpha [K], bases U [K, D, d], component weights pi [K, L],
  latent means mu [K, L, d], latent covariances S [K, L, d, d] or their diagonals
  [K, L, d] (a diagonal S in the coordinates of U_k)."""

  weights: jax.Array
  bases: jax.Array
  component_weights: jax.Array
  means: jax.Array
  covariances: jax.Array


def check_mixture(mix: MoLRMoG) -> None:
  """Refuse inconsistent shapes, and non-orthonormal bases when they are concrete."""
  if mix.bases.ndim != 3 or mix.bases.shape[2] > mix.bases.shape[1]:
    raise ConfigError(f"bases of shape {mix.bases.shape} must be [K, D, d] with d <= D")
  k, _, d = mix.bases.shape
  lc = mix.component_weights.shape[-1] if mix.component_weights.ndim == 2 else -1
  want: dict[str, list[tuple[int, ...]]] = {
    "weights": [(k,)],
    "component_weights": [(k, lc)],
    "means": [(k, lc, d)],
    "covariances": [(k, lc, d, d), (k, lc, d)],
  }
  for name, shapes in want.items():
    if getattr(mix, name).shape not in shapes:
      raise ConfigError(
        f"{name} of shape {getattr(mix, name).shape} must be "
        f"{' or '.join(map(str, shapes))} (K={k}, L={lc}, d={d})"
      )
  if not isinstance(mix.bases, jax.core.Tracer):
    gram = np.einsum("kDi,kDj->kij", np.asarray(mix.bases), np.asarray(mix.bases))
    if np.abs(gram - np.eye(d)).max() > 1e-4:
      raise ConfigError("bases must be orthonormal: U_k^T U_k = I")


def check_sigma(sigma, n: int | None = None) -> jax.Array:
  """sigma (a number or [n]) as given; refuse sigma <= 0 (p_t has no density in R^D)."""
  sigma = jnp.asarray(sigma)
  if sigma.ndim > 1 or (sigma.ndim == 1 and n is not None and sigma.shape[0] != n):
    raise ConfigError(f"noise level sigma of shape {sigma.shape} must be a number or [n={n}]")
  if not isinstance(sigma, jax.core.Tracer) and bool(jnp.any(sigma <= 0)):
    raise ConfigError(f"noise level sigma={float(jnp.min(sigma)):g} must be > 0")
  return sigma


def check_sizes(dim: int, num_experts: int, latent_dim: int, num_components: int = 1):
  """Refuse a latent dimension outside [1, dim] and counts below 1."""
  if not 1 <= latent_dim <= dim or min(num_experts, num_components) < 1:
    raise ConfigError(
      f"expected 1 <= latent_dim={latent_dim} <= dim={dim}, subspaces K="
      f"{num_experts} >= 1 and num_components={num_components} >= 1"
    )


def check_points(x: jax.Array, dim: int) -> None:
  if x.ndim != 2 or x.shape[1] != dim:
    raise ConfigError(f"points x of shape {x.shape} must be [n, D={dim}]")


def _sigma_column(sigma, x):
  """[n, 1] sigma for points x [n, D], checked."""
  return jnp.broadcast_to(check_sigma(sigma, x.shape[0]).astype(x.dtype), x.shape[:1])[:, None]


def make_mixture(
  seed: int,
  dim: int,
  num_subspaces: int,
  latent_dim: int,
  num_components: int,
  *,
  mean_scale: float = 3.0,
  latent_std: float = 1.0,
) -> MoLRMoG:
  """A random MoLR-MoG: Haar-random bases, latent means N(0, mean_scale^2 I),
  covariances latent_std^2 I, equal weights (GUESS: the paper's instance is not known)."""
  check_sizes(dim, num_subspaces, latent_dim, num_components)
  key_u, key_m = jax.random.split(jax.random.key(seed))
  bases = jnp.linalg.qr(jax.random.normal(key_u, (num_subspaces, dim, latent_dim)))[0]
  means = mean_scale * jax.random.normal(key_m, (num_subspaces, num_components, latent_dim))
  return MoLRMoG(
    jnp.full((num_subspaces,), 1 / num_subspaces),
    bases,
    jnp.full((num_subspaces, num_components), 1 / num_components),
    means,
    jnp.full(means.shape, latent_std**2),
  )


def make_rich_mixture(
  seed: int,
  dim: int,
  num_subspaces: int,
  latent_dim: int,
  num_components: int,
  *,
  mean_scale: float = 3.0,
  spread=(0.3, 2.0),
) -> MoLRMoG:
  """A MoLR-MoG outside the family of networks with fewer latent components and diagonal
  latent covariances: Haar-random bases, latent means N(0, mean_scale^2 I), full latent
  covariances Q diag(lam) Q^T (Q Haar, lam log-uniform on `spread`), component weights
  Dirichlet(1) within each subspace, equal subspace weights. Its score is still the
  closed form `molr_mog_score`, so a network's score error stays exact."""
  check_sizes(dim, num_subspaces, latent_dim, num_components)
  if not 0 < spread[0] <= spread[1]:
    raise ConfigError(f"spread={tuple(spread)} must have 0 < low <= high")
  key_u, key_m, key_q, key_l, key_w = jax.random.split(jax.random.key(seed), 5)
  bases = jnp.linalg.qr(jax.random.normal(key_u, (num_subspaces, dim, latent_dim)))[0]
  shape = (num_subspaces, num_components)
  means = mean_scale * jax.random.normal(key_m, (*shape, latent_dim))
  rotations = jnp.linalg.qr(jax.random.normal(key_q, (*shape, latent_dim, latent_dim)))[0]
  lam = jnp.exp(
    jax.random.uniform(
      key_l, (*shape, latent_dim), minval=math.log(spread[0]), maxval=math.log(spread[1])
    )
  )
  covariances = jnp.einsum("klij,klj,klmj->klim", rotations, lam, rotations)
  weights = jax.random.dirichlet(key_w, jnp.ones(num_components), (num_subspaces,))
  return MoLRMoG(jnp.full((num_subspaces,), 1 / num_subspaces), bases, weights, means, covariances)


def sample(mix: MoLRMoG, n: int, seed: int) -> jax.Array:
  """[n, D] clean points x = U_k z (seeded)."""
  check_mixture(mix)
  return _sample(mix, jax.random.key(seed), n)


@jax.jit(static_argnames="n")
def _sample(mix, key, n):
  keys = jax.random.split(key, 3)
  k = jax.random.categorical(keys[0], jnp.log(mix.weights), shape=(n,))
  comp = jax.random.categorical(keys[1], jnp.log(mix.component_weights[k]))
  eigenvalues, eigenvectors = _latent_spectrum(mix)
  g = jnp.sqrt(eigenvalues[k, comp]) * jax.random.normal(
    keys[2], (n, mix.means.shape[-1]), mix.means.dtype
  )
  if eigenvectors is not None:
    g = jnp.einsum("nij,nj->ni", eigenvectors[k, comp], g)
  return jnp.einsum("nDd,nd->nD", mix.bases[k], mix.means[k, comp] + g)


def _latent_spectrum(mix):
  """Eigenvalues [K, L, d] and eigenvectors [K, L, d, d] of S (None when diagonal)."""
  if mix.covariances.ndim == 3:
    return mix.covariances, None
  return jnp.linalg.eigh(mix.covariances)


def _checked_variance(x, sigma, mix):
  """[n, 1, 1] sigma^2 after the checks of mix, x and sigma."""
  check_mixture(mix)
  check_points(x, mix.bases.shape[1])
  return _sigma_column(sigma, x)[:, :, None] ** 2


def _component_terms(x, var, mix):
  """log alpha_k pi_kl N_kl(x) [n, K, L], C^-1 (y - mu) [n, K, L, d], x - U y [n, K, D]."""
  dim, latent = mix.bases.shape[1:]
  y = jnp.einsum("nD,kDd->nkd", x, mix.bases)
  outside = x[:, None] - jnp.einsum("nkd,kDd->nkD", y, mix.bases)
  eigenvalues, eigenvectors = _latent_spectrum(mix)
  total = eigenvalues[None] + var[..., None]  # [n, K, L, d]: the spectrum of C
  diff = y[:, :, None] - mix.means[None]  # in the eigenbasis of S below
  diff = diff if eigenvectors is None else jnp.einsum("klij,nkli->nklj", eigenvectors, diff)
  solved = diff / total
  log_n = -0.5 * (
    jnp.sum(diff * solved, -1)
    + jnp.sum(jnp.log(total), -1)
    + jnp.sum(outside**2, -1)[..., None] / var
    + (dim - latent) * jnp.log(var)
    + dim * math.log(2 * math.pi)
  )
  log_joint = jnp.log(mix.weights)[:, None] + jnp.log(mix.component_weights) + log_n
  if eigenvectors is not None:
    solved = jnp.einsum("klij,nklj->nkli", eigenvectors, solved)
  return log_joint, solved, outside


def molr_mog_log_density(x: jax.Array, sigma, mix: MoLRMoG) -> jax.Array:
  """[n] log p_t(x) at noise level sigma (a number or [n]), by logsumexp."""
  return _log_density(x, _checked_variance(x, sigma, mix), mix)


@jax.jit
def _log_density(x, var, mix):
  log_joint = _component_terms(x, var, mix)[0]
  return jax.nn.logsumexp(log_joint.reshape(x.shape[0], -1), axis=-1)


def molr_mog_score(x: jax.Array, sigma, mix: MoLRMoG) -> jax.Array:
  """[n, D] grad_x log p_t(x): the posterior-gated nested MoE of the module docstring."""
  return _score(x, _checked_variance(x, sigma, mix), mix)


@jax.jit
def _score(x, var, mix):
  log_joint, solved, outside = _component_terms(x, var, mix)
  flat = log_joint.reshape(x.shape[0], -1)
  w = jnp.exp(flat - jax.nn.logsumexp(flat, -1, keepdims=True)).reshape(log_joint.shape)
  inside = jnp.einsum("kDd,nkd->nD", mix.bases, jnp.sum(w[..., None] * solved, 2))
  return -inside - jnp.einsum("nk,nkD->nD", w.sum(-1), outside) / var[:, 0]


def score_error(
  score_fn, mix: MoLRMoG, sigma: float, *, num_samples: int = 4096, seed: int = 0
) -> float:
  """E |s_theta(x_t) - s_true(x_t)|^2 / E |s_true(x_t)|^2, x_t ~ p_t (Monte Carlo)."""
  check_sigma(sigma)
  x = sample(mix, num_samples, seed)
  x = x + sigma * jax.random.normal(jax.random.fold_in(jax.random.key(seed), 1), x.shape, x.dtype)
  true = molr_mog_score(x, sigma, mix)
  return float(jnp.sum((score_fn(x, sigma) - true) ** 2) / jnp.sum(true**2))
