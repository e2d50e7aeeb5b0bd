r"""MoLR-MoG score networks and their training (the data model
and the closed-form score are in moejax/mixtures/score_mixture.py).

Score networks. GUESS: the paper's MoE networks are this closed form with learnable
parameters (diagonal latent variances, U_k = Gram-Schmidt of a free matrix):
  MoELatentMoG: expert k = (U_k, a latent MoG), scored through `molr_mog_score`.
  MoELatentGaussian: L = 1 (MoLRG, Wang et al. 2024), written as Tweedie's denoiser
    E[x | x_t, k] = U_k (mu_k + S_k C_k^-1 (y - mu_k)), a second derivation.
  ScoreMLP: baseline, one hidden layer, EDM preconditioning (Karras et al. 2022 tab. 1).
Training: sigma^2-weighted denoising score matching (Vincent 2011; Song and Ermon 2019
eq. 2), log-uniform sigma, Adam with cosine decay; `init_from_data` (GUESS) starts the
MoE networks from subspace seeding and per-expert k-means, as random starts often stall
with a subspace uncovered.
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from moejax.errors import ConfigError
from moejax.mixtures import gmm as gmm_lib
from moejax.mixtures.score_mixture import (
  MoLRMoG,
  _sigma_column,
  check_points,
  check_sigma,
  check_sizes,
  molr_mog_score,
)


def _seed_bases(x: np.ndarray, num_experts: int, latent_dim: int, seed: int) -> np.ndarray:
  """[K, D, d] bases, k-means++-like: a seed point drawn with probability proportional to
  its squared residual off the bases so far (the first uniformly), its basis the top-d
  right singular vectors of it and the 4 d points of largest |cosine| with it."""
  rng = np.random.default_rng(seed)
  unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
  residual, bases = np.sum(x**2, 1), []
  for _ in range(num_experts):
    weights = residual / residual.sum() if residual.sum() > 0 else None
    seed_point = rng.choice(len(x), p=weights)
    near = np.argsort(-np.abs(unit @ unit[seed_point]))[: 4 * latent_dim + 1]  # with it
    bases.append(np.linalg.svd(x[near], full_matrices=False)[2][:latent_dim].T)
    residual = np.minimum(residual, np.sum((x - x @ bases[-1] @ bases[-1].T) ** 2, 1))
  return np.stack(bases)


def _latent_kmeans(y: np.ndarray, comps: int, seed, steps: int = 20, restarts: int = 5):
  """Means, per-dimension variances [L, d] and weights [L] of the k-means clustering
  (k-means++ seeds, Lloyd steps) of lowest within-cluster sum of squares over restarts."""
  best = None
  for restart in range(restarts):
    means = gmm_lib.kmeans_plus_plus(y, comps, [*seed, restart])
    for _ in range(steps + 1):
      sq = np.sum((y[:, None] - means[None]) ** 2, -1)
      label = np.argmin(sq, 1)
      means = np.stack(
        [y[label == j].mean(0) if np.any(label == j) else means[j] for j in range(comps)]
      )
    if best is None or sq.min(1).sum() < best[0]:
      variances = np.stack(
        [
          y[label == j].var(0) if np.sum(label == j) > 1 else np.ones(y.shape[1])
          for j in range(comps)
        ]
      )
      best = sq.min(1).sum(), means, variances, np.bincount(label, minlength=comps) / len(y)
  if best is None:
    raise ValueError(f"restarts={restarts} must be >= 1")
  return best[1:]


def init_from_data(model, data: jax.Array, *, seed: int = 0) -> None:
  """Set a MoELatentMoG's or MoELatentGaussian's parameters from `data` [n, D] in place
  (GUESS: the paper's initialisation is not known): _seed_bases, each point to its nearest
  basis, per expert _latent_kmeans of its points' latent coordinates (means, variances,
  weights), expert weights from the counts."""
  num_experts, dim, latent_dim = model.bases_raw.shape
  comps = model.means.shape[1] if model.means.ndim == 3 else 1
  check_points(jnp.asarray(data), dim)
  x = np.asarray(data, np.float64)
  if len(x) < latent_dim:
    raise ConfigError(f"data of shape {x.shape} has fewer points than latent_dim={latent_dim}")
  bases = _seed_bases(x, num_experts, latent_dim, seed)  # orthonormal(bases) = bases
  owner = np.argmin([np.sum((x - x @ u @ u.T) ** 2, 1) for u in bases], axis=0)
  means = np.zeros((num_experts, comps, latent_dim))
  variances, weights = np.ones_like(means), np.full((num_experts, comps), 1 / comps)
  for k, u in enumerate(bases):
    if np.sum(owner == k) >= comps:
      means[k], variances[k], weights[k] = _latent_kmeans(x[owner == k] @ u, comps, [seed, k])
  squeeze = (lambda a: a) if model.means.ndim == 3 else (lambda a: a[:, 0])

  def as_param(a):
    return jnp.asarray(a, model.means[...].dtype)

  model.bases_raw[...] = as_param(bases)
  model.means[...] = as_param(squeeze(means))
  model.log_variances[...] = as_param(squeeze(np.log(np.maximum(variances, 1e-2))))
  if model.means.ndim == 3:
    model.component_logits[...] = as_param(np.log(np.maximum(weights, 1e-6)))
  model.logits[...] = as_param(
    np.log(np.maximum(np.bincount(owner, minlength=num_experts), 1) / len(x))
  )


def _random_bases(rngs: nnx.Rngs, shape) -> nnx.Param:
  """Free matrices behind U, N(0, 1 / D) entries: unit columns, which Adam turns quickly."""
  return nnx.Param(jax.random.normal(rngs.params(), shape) / math.sqrt(shape[1]))


def orthonormal(raw: jax.Array) -> jax.Array:
  """[K, D, d] orthonormal bases: the Q of the QR decomposition of each raw [D, d] with
  diagonal R > 0 (Gram-Schmidt), continuous in raw; Householder QR's own signs flip."""
  q, r = jnp.linalg.qr(raw)
  return q * jnp.where(jnp.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0)[..., None, :]


class MoELatentMoG(nnx.Module):
  """K experts, each a subspace U_k and a latent L-component MoG with diagonal
  covariances; s(x, sigma) = molr_mog_score of those parameters."""

  def __init__(
    self, dim: int, num_experts: int, latent_dim: int, num_components: int, *, rngs: nnx.Rngs
  ):
    check_sizes(dim, num_experts, latent_dim, num_components)
    shape = (num_experts, num_components, latent_dim)
    self.bases_raw = _random_bases(rngs, (num_experts, dim, latent_dim))
    self.means = nnx.Param(jax.random.normal(rngs.params(), shape))
    self.log_variances = nnx.Param(jnp.zeros(shape))
    self.component_logits = nnx.Param(jnp.zeros(shape[:2]))
    self.logits = nnx.Param(jnp.zeros((num_experts,)))

  def mixture(self) -> MoLRMoG:
    return MoLRMoG(
      jax.nn.softmax(self.logits[...]),
      orthonormal(self.bases_raw[...]),
      jax.nn.softmax(self.component_logits[...], -1),
      self.means[...],
      jnp.exp(self.log_variances[...]),
    )

  def __call__(self, x: jax.Array, sigma) -> jax.Array:
    return molr_mog_score(x, sigma, self.mixture())


class MoELatentGaussian(nnx.Module):
  """K experts, each a subspace U_k and one latent Gaussian N(mu_k, diag v_k); the score
  (E[x | x_t] - x) / sigma^2 with E[x | x_t] the posterior-gated Tweedie denoiser."""

  def __init__(self, dim: int, num_experts: int, latent_dim: int, *, rngs: nnx.Rngs):
    check_sizes(dim, num_experts, latent_dim)
    self.bases_raw = _random_bases(rngs, (num_experts, dim, latent_dim))
    self.means = nnx.Param(jax.random.normal(rngs.params(), (num_experts, latent_dim)))
    self.log_variances = nnx.Param(jnp.zeros((num_experts, latent_dim)))
    self.logits = nnx.Param(jnp.zeros((num_experts,)))

  def __call__(self, x: jax.Array, sigma) -> jax.Array:
    bases = orthonormal(self.bases_raw[...])
    check_points(x, bases.shape[1])
    var = _sigma_column(sigma, x) ** 2  # [n, 1]
    latent_var = jnp.exp(self.log_variances[...])  # [K, d]
    total = latent_var[None] + var[..., None]  # [n, K, d] the diagonal of C_k
    y = jnp.einsum("nD,kDd->nkd", x, bases)
    diff = y - self.means[...][None]
    off = jnp.sum(x**2, -1, keepdims=True) - jnp.sum(y**2, -1)  # |x - U_k y|^2
    log_gate = jax.nn.log_softmax(self.logits[...]) - 0.5 * (
      jnp.sum(diff**2 / total + jnp.log(total), -1)
      + off / var
      + (x.shape[1] - bases.shape[2]) * jnp.log(var)
    )
    gate = jax.nn.softmax(log_gate, -1)
    latent_mean = self.means[...][None] + latent_var[None] * diff / total  # E[z | x_t, k]
    denoised = jnp.einsum("nk,kDd,nkd->nD", gate, bases, latent_mean)
    return (denoised - x) / var


class ScoreMLP(nnx.Module):
  """Baseline: s = (c_skip x + c_out F(c_in x, ln(sigma) / 4) - x) / sigma^2, F one
  hidden GELU layer of `width` (EDM preconditioning with data std `data_std`)."""

  def __init__(self, dim: int, width: int, *, rngs: nnx.Rngs, data_std: float = 1.0):
    if width < 1 or data_std <= 0:
      raise ConfigError(f"expected width={width} >= 1 and data_std={data_std} > 0")
    self.hidden = nnx.Linear(dim + 1, width, rngs=rngs)
    self.out = nnx.Linear(width, dim, rngs=rngs)
    self.data_std = data_std

  def __call__(self, x: jax.Array, sigma) -> jax.Array:
    check_points(x, self.out.out_features)
    s = _sigma_column(sigma, x)
    total = s**2 + self.data_std**2
    h = jax.nn.gelu(self.hidden(jnp.concatenate([x / jnp.sqrt(total), jnp.log(s) / 4], -1)))
    denoised = (self.data_std**2 * x + s * self.data_std * self.out(h)) / total
    return (denoised - x) / s**2


def mlp_width(num_params: int, dim: int) -> int:
  """The ScoreMLP width whose parameter count, w (2 D + 2) + D, is nearest num_params."""
  return max(1, round((num_params - dim) / (2 * dim + 2)))


def count_params(model: nnx.Module) -> int:
  return sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


def dsm_loss(score_fn, x: jax.Array, sigma: jax.Array, noise: jax.Array) -> jax.Array:
  """mean_n |sigma_n s(x_n + sigma_n eps_n, sigma_n) + eps_n|^2 (sigma^2-weighted DSM).

  Its minimiser is the true score; there its expectation is D - E sigma^2 |s_true|^2."""
  s = check_sigma(sigma, x.shape[0])[:, None]
  return jnp.mean(jnp.sum((s * score_fn(x + s * noise, sigma) + noise) ** 2, -1))


def train_dsm(
  model: nnx.Module,
  data: jax.Array,
  *,
  steps: int,
  batch_size: int = 256,
  learning_rate: float = 1e-2,
  sigma_range=(0.05, 20.0),
  seed: int = 0,
):
  """Train `model` in place by DSM on `data` [n, D] with Adam (cosine decay to 0), sigma
  log-uniform on sigma_range, fresh noise each step (one jitted scan); returns the
  losses [steps]."""
  if steps < 1 or batch_size < 1 or learning_rate <= 0:
    raise ConfigError(
      f"expected steps={steps} >= 1, batch_size={batch_size} >= 1, "
      f"learning_rate={learning_rate} > 0"
    )
  low, high = sigma_range
  if not 0 < low <= high:
    raise ConfigError(f"noise range sigma_range={tuple(sigma_range)} must have 0 < low <= high")
  if data.ndim != 2 or data.shape[0] < 1:
    raise ConfigError(f"training data of shape {data.shape} must be [n >= 1, D]")
  split = nnx.split(model, nnx.Param, ...)
  graphdef, params, rest = split  # type: ignore[misc]  # nnx.split stub: any arity
  params, losses = _train_scan(
    graphdef,
    params,
    rest,
    jnp.asarray(data),
    jax.random.split(jax.random.key(seed), steps),
    jnp.log(jnp.asarray([low, high], data.dtype)),
    jnp.asarray(learning_rate, data.dtype),
    batch_size,
  )
  nnx.update(model, params)
  return losses


@jax.jit(static_argnames=("graphdef", "batch_size"))
def _train_scan(graphdef, params, rest, data, keys, log_range, learning_rate, batch_size):
  """The DSM steps of train_dsm, one per key (compiled once per model and data shape)."""
  optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate, keys.shape[0]))

  def loss_fn(params, key):
    keys = jax.random.split(key, 3)
    rows = data[jax.random.randint(keys[0], (batch_size,), 0, data.shape[0])]
    sigma = jnp.exp(jax.random.uniform(keys[1], (batch_size,), data.dtype, *log_range))
    noise = jax.random.normal(keys[2], rows.shape, rows.dtype)
    return dsm_loss(nnx.merge(graphdef, params, rest), rows, sigma, noise)

  def step(carry, key):
    params, state = carry
    loss, grads = jax.value_and_grad(loss_fn)(params, key)
    updates, state = optimizer.update(grads, state, params)
    return (optax.apply_updates(params, updates), state), loss

  (params, _), losses = jax.lax.scan(step, (params, optimizer.init(params)), keys)
  return params, losses
