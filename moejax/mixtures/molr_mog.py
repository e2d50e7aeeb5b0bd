r"""One replicate of the MoLR-MoG study (arXiv 2601.01475; configs/studies/molr_mog.py):
build a score model, train it by DSM on points of a MoLR-MoG instance and score it
against the closed-form score (moejax/mixtures/score_mixture.py, score_networks.py).

Models (MODELS): the MoE-latent-MoG and the MoE-latent-Gaussian (started by
init_from_data: subspace seeding and per-expert k-means; the *_random variants from a
random start), and a plain MLP with the MoE-latent-MoG's parameter count (mlp) or 10x
it (mlp10; the paper's 10x baseline is a U-Net).

`fit_and_score` of replicate `seed` uses the seeds of the instance (make_mixture(seed)),
the training points (sample(seed + 1000); the first n of one draw), the model
initialisation (2000 + seed), the DSM steps (3000 + seed), the score-error points
(4000 + seed) and the held-out DSM points and noise (6000 + seed, 5000 + seed).
"""

from __future__ import annotations

import itertools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError
from moejax.mixtures import score_mixture as sm
from moejax.mixtures import score_networks as sn

MODELS = {
  "mog": "MoE-latent-MoG",
  "gaussian": "MoE-latent-Gaussian",
  "mlp": "MLP (equal params)",
  "mlp10": "MLP (10x params)",
  "mog_random": "MoE-latent-MoG, random start",
  "gaussian_random": "MoE-latent-Gaussian, random start",
}


def instance(
  seed: int,
  dim: int,
  subspaces: int,
  latent_dim: int,
  components: int,
  *,
  mean_scale: float,
  points: int,
  data_components: int | None = None,
) -> tuple[sm.MoLRMoG, jax.Array]:
  """Replicate `seed`'s mixture and its `points` training points (nested: fit on the first
  n). data_components None: the networks' own family (make_mixture, `components` latent
  components, covariance I); an int: make_rich_mixture with that many full-covariance
  components, outside the family of networks with `components` diagonal ones."""
  if data_components is None:
    mix = sm.make_mixture(seed, dim, subspaces, latent_dim, components, mean_scale=mean_scale)
  else:
    mix = sm.make_rich_mixture(
      seed, dim, subspaces, latent_dim, data_components, mean_scale=mean_scale
    )
  return mix, sm.sample(mix, points, 1000 + seed)


def build(
  name: str,
  seed: int,
  data: jax.Array,
  *,
  dim: int,
  subspaces: int,
  latent_dim: int,
  components: int,
) -> nnx.Module:
  """A fresh model (MoE ones started by init_from_data unless *_random); the MLPs'
  widths match 1x or 10x the MoE-latent-MoG's parameters."""
  if name not in MODELS:
    raise ConfigError(f"model={name!r} is not known; valid: {', '.join(MODELS)}")
  rngs = nnx.Rngs(2000 + seed)
  if name.startswith(("mog", "gaussian")):
    model = (
      sn.MoELatentMoG(dim, subspaces, latent_dim, components, rngs=rngs)
      if name.startswith("mog")
      else sn.MoELatentGaussian(dim, subspaces, latent_dim, rngs=rngs)
    )
    if not name.endswith("_random"):
      sn.init_from_data(model, data, seed=seed)
    return model
  target = sn.count_params(
    sn.MoELatentMoG(dim, subspaces, latent_dim, components, rngs=nnx.Rngs(0))
  )
  width = sn.mlp_width(target * (10 if name == "mlp10" else 1), dim)
  return sn.ScoreMLP(dim, width, rngs=rngs, data_std=float(jnp.sqrt(jnp.mean(data**2))))


def subspace_angle(true_bases, learned_bases) -> float:
  """Largest principal angle (degrees) between true and learned subspaces under the
  expert matching that minimises it (all K! matchings; K is small); from the sine,
  |(I - U U^T) V|_2, in float64 (the cosine loses small angles to rounding)."""
  true_bases, learned_bases = (np.asarray(b, np.float64) for b in (true_bases, learned_bases))
  residual = learned_bases[None] - np.einsum(
    "kDi,kEi,jEl->kjDl", true_bases, true_bases, learned_bases
  )
  sines = np.linalg.norm(residual, ord=2, axis=(2, 3))  # [K true, K learned]
  k = len(true_bases)
  best = min(
    max(sines[i, p[i]] for i in range(k))
    for p in itertools.permutations(range(len(learned_bases)), k)
  )
  return float(np.degrees(np.arcsin(min(best, 1.0))))


def fit_and_score(
  name: str,
  mix: sm.MoLRMoG,
  data: jax.Array,
  seed: int,
  sigmas,
  *,
  subspaces: int,
  latent_dim: int,
  components: int,
  steps: int,
  batch_size: int,
  learning_rate: float,
  sigma_min: float,
  sigma_max: float,
  eval_samples: int,
) -> dict:
  """Train model `name` on `data` by DSM; its relative score errors E|s_theta - s|^2 /
  E|s|^2 before and after training at each sigma ({sigma: error}), the held-out DSM
  loss above the true score's (same points and noise), the parameter count, the mean
  of the last 200 training losses and, for the MoE models, subspace_angle."""
  dim = mix.bases.shape[1]
  model = build(
    name, seed, data, dim=dim, subspaces=subspaces, latent_dim=latent_dim, components=components
  )

  def errors():
    return {
      s: sm.score_error(model, mix, float(s), num_samples=eval_samples, seed=4000 + seed)
      for s in sigmas
    }

  start = errors()
  rows = max(len(data), 4096)  # tile n | rows points: uniform batches, one compile for all n
  tiled = jnp.tile(data, (rows // len(data), 1)) if rows % len(data) == 0 else data
  losses = sn.train_dsm(
    model,
    tiled,
    steps=steps,
    seed=3000 + seed,
    batch_size=batch_size,
    learning_rate=learning_rate,
    sigma_range=(sigma_min, sigma_max),
  )
  out = {
    "score_error": errors(),
    "start_score_error": start,
    "params": sn.count_params(model),
    "final_train_loss": float(jnp.mean(losses[-200:])),
  }
  keys = jax.random.split(jax.random.key(5000 + seed), 3)
  held = sm.sample(mix, eval_samples, 6000 + seed)
  sigma = jnp.exp(
    jax.random.uniform(keys[0], (len(held),), minval=np.log(sigma_min), maxval=np.log(sigma_max))
  )
  noise = jax.random.normal(keys[1], held.shape)

  def true_fn(x, s):
    return sm.molr_mog_score(x, s, mix)

  out["dsm_excess"] = float(
    sn.dsm_loss(model, held, sigma, noise) - sn.dsm_loss(true_fn, held, sigma, noise)
  )
  if isinstance(model, (sn.MoELatentMoG, sn.MoELatentGaussian)):
    out["max_angle_deg"] = subspace_angle(
      np.asarray(mix.bases), np.asarray(sn.orthonormal(model.bases_raw[...]))
    )
  return out
