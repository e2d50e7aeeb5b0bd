"""MoLR-MoG score networks (moejax/mixtures/score_mixture.py, score_networks.py)
against oracles: autodiff of log p_t, the dense Gaussian-mixture density, the two
derivations of the n_k = 1 score, the DSM identity at the true score, training, the
study's subspace angle against a rotation by a known angle, and the refusals."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.stats import multivariate_normal

from moejax.errors import ConfigError
from moejax.mixtures import molr_mog
from moejax.mixtures import score_mixture as sm
from moejax.mixtures import score_networks as sn

SIGMAS = (0.05, 0.3, 1.0, 4.0)


def random_mixture(seed, dim=7, k=3, d=2, comps=3, full=True):
  """Unequal weights, latent means N(0, 4 I), random SPD (or diagonal) covariances; float64."""
  rng = np.random.default_rng(seed)
  bases = np.linalg.qr(rng.normal(size=(k, dim, d)))[0]
  root = rng.normal(size=(k, comps, d, d))
  cov = (
    root @ root.transpose(0, 1, 3, 2) + 0.2 * np.eye(d)
    if full
    else rng.uniform(0.2, 2.0, size=(k, comps, d))
  )
  return sm.MoLRMoG(
    *map(
      jnp.asarray,
      (
        rng.dirichlet(np.ones(k)),
        bases,
        rng.dirichlet(np.ones(comps), size=k),
        2.0 * rng.normal(size=(k, comps, d)),
        cov,
      ),
    )
  )


def noisy_points(mix, n, sigma, seed):
  """[n, D] points of p_t at sigma (a number or [n, 1])."""
  x = sm.sample(mix, n, seed)
  return x + sigma * jax.random.normal(jax.random.key(seed + 1), x.shape, x.dtype)


@pytest.mark.parametrize("full", [True, False])
def test_closed_form_score_is_the_gradient_of_log_p(full):
  with jax.enable_x64(True):
    mix = random_mixture(0, full=full)
    grad = jax.jit(jax.grad(lambda x, s: jnp.sum(sm.molr_mog_log_density(x, s, mix))))
    score = jax.jit(lambda x, s: sm.molr_mog_score(x, s, mix))
    per_point = np.random.default_rng(2).uniform(0.05, 4.0, 64)  # one sigma per point
    for sigma in [*SIGMAS, per_point]:
      x = noisy_points(mix, 64, np.asarray(sigma)[..., None], 1)
      sigma = jnp.full((64,), sigma)
      np.testing.assert_allclose(score(x, sigma), grad(x, sigma), rtol=1e-5, atol=1e-5)


def test_log_density_is_the_dense_gaussian_mixture():
  """Each latent component maps to N(U mu, U S U^T + sigma^2 I) in R^D."""
  with jax.enable_x64(True):
    mix = random_mixture(4)
    for sigma in SIGMAS:
      x = noisy_points(mix, 32, sigma, 5)
      dense = [
        jnp.log(mix.weights[k] * mix.component_weights[k, comp])
        + multivariate_normal.logpdf(
          x,
          mix.bases[k] @ mix.means[k, comp],
          mix.bases[k] @ mix.covariances[k, comp] @ mix.bases[k].T + sigma**2 * jnp.eye(7),
        )
        for k in range(3)
        for comp in range(3)
      ]
      np.testing.assert_allclose(
        sm.molr_mog_log_density(x, sigma, mix), jax.nn.logsumexp(jnp.stack(dense), 0), rtol=1e-10
      )


def test_sampler_is_seeded_and_lies_on_the_subspaces():
  mix = sm.make_mixture(0, 16, 3, 2, 2)
  x = sm.sample(mix, 500, 7)
  np.testing.assert_array_equal(x, sm.sample(mix, 500, 7))
  assert not np.allclose(x, sm.sample(mix, 500, 8))
  off = [jnp.linalg.norm(x - x @ u @ u.T, axis=1) for u in mix.bases]
  assert float(jnp.max(jnp.min(jnp.stack(off), 0))) < 1e-5


def gaussian_model(seed, dim=9, k=3, d=3):
  """A MoE-latent-Gaussian with random (not initial) means, variances and gate logits."""
  model = sn.MoELatentGaussian(dim, k, d, rngs=nnx.Rngs(seed))
  rng = np.random.default_rng(seed)
  model.means[...] = jnp.asarray(2.0 * rng.normal(size=(k, d)))
  model.log_variances[...] = jnp.asarray(rng.normal(size=(k, d)))
  model.logits[...] = jnp.asarray(rng.normal(size=k))
  return model


@pytest.mark.parametrize("copies", [1, 2])
def test_latent_mog_with_one_component_is_the_latent_gaussian(copies):
  """n_k = 1 (or n_k = 2 identical components): the same score, by a second derivation."""
  with jax.enable_x64(True):
    gauss = gaussian_model(0)
    mog = sn.MoELatentMoG(9, 3, 3, copies, rngs=nnx.Rngs(1))
    mog.bases_raw[...] = gauss.bases_raw[...]
    mog.means[...] = jnp.repeat(gauss.means[...][:, None], copies, 1)
    mog.log_variances[...] = jnp.repeat(gauss.log_variances[...][:, None], copies, 1)
    mog.logits[...] = gauss.logits[...]
    mix = mog.mixture()
    for sigma in SIGMAS:
      x = noisy_points(mix, 32, sigma, 2)
      np.testing.assert_allclose(mog(x, sigma), gauss(x, sigma), rtol=1e-9, atol=1e-9)
    mog.means[...] = mog.means[...] + 0.5  # a different latent mean: a different score
    assert not np.allclose(mog(x, 1.0), gauss(x, 1.0), rtol=1e-3)


def test_dsm_at_the_true_score_is_its_minimum():
  """E|sigma s + eps|^2 = D - sigma^2 E|s|^2 only at s = E[-eps / sigma | x_t] (per point,
  within 4 standard errors), and perturbing the true score raises the DSM loss by about
  sigma^2 E|delta|^2 (the cross term has mean zero)."""
  with jax.enable_x64(True):
    mix = random_mixture(6, dim=6, k=2, d=2, comps=2)
    n = 20000
    x = sm.sample(mix, n, 0)
    noise = jax.random.normal(jax.random.key(1), x.shape, x.dtype)

    def true(y, s):
      return sm.molr_mog_score(y, s, mix)

    for sigma in (0.2, 1.0, 3.0):
      s = jnp.full((n,), sigma)
      for scale, holds in ((1.0, True), (1.1, False), (0.9, False)):
        score = true(x + sigma * noise, s) * scale
        gap = jnp.sum((sigma * score + noise) ** 2, 1) - (6 - sigma**2 * jnp.sum(score**2, 1))
        within = abs(float(gap.mean())) < 4 * float(gap.std()) / np.sqrt(n)
        assert within == holds, (sigma, scale, float(gap.mean()), float(gap.std()))
      base = float(sn.dsm_loss(true, x, s, noise))
      for shift in (
        lambda y: jnp.ones_like(y) / sigma,
        lambda y: 0.3 * jnp.roll(y, 1, axis=1) / (1 + sigma**2),
      ):

        def perturbed(y, t, f=shift):
          return true(y, t) + f(y)

        rise = float(sn.dsm_loss(perturbed, x, s, noise)) - base
        expected = sigma**2 * float(jnp.mean(jnp.sum(shift(x + sigma * noise) ** 2, 1)))
        assert rise == pytest.approx(expected, rel=0.15)


@pytest.mark.integration
def test_training_lowers_the_score_error():
  mix = sm.make_mixture(3, 8, 2, 2, 2)
  data = sm.sample(mix, 1024, 1)
  model = sn.MoELatentMoG(8, 2, 2, 2, rngs=nnx.Rngs(11))
  before = [sm.score_error(model, mix, s, num_samples=512) for s in (0.3, 1.0)]
  losses = sn.train_dsm(model, data, steps=300, batch_size=128, learning_rate=2e-2)
  after = [sm.score_error(model, mix, s, num_samples=512) for s in (0.3, 1.0)]
  assert losses.shape == (300,) and float(losses[-50:].mean()) < float(losses[:50].mean())
  assert all(a < 0.3 * b for a, b in zip(after, before)), (before, after)


def test_orthonormal_is_continuous_gram_schmidt():
  """Q with diag(R) > 0: fixed on orthonormal inputs, no sign flip when an entry that
  Householder QR pivots on crosses zero (a flip would scramble the latent coordinates)."""
  with jax.enable_x64(True):
    bases = np.asarray(sm.make_mixture(0, 8, 2, 3, 1).bases, np.float64)
    np.testing.assert_allclose(sn.orthonormal(jnp.asarray(bases)), bases, atol=1e-12)
    flipped = []
    for tiny in (1e-9, -1e-9):  # the pivot entry of the first column crosses zero
      raw = bases.copy()
      raw[:, 0, 0] = tiny
      flipped.append(sn.orthonormal(jnp.asarray(raw)))
      assert np.all(np.diagonal(jnp.linalg.qr(raw)[1], axis1=1, axis2=2)[:, 0] * tiny < 0)
    np.testing.assert_allclose(flipped[0], flipped[1], atol=1e-8)


def test_init_from_data_finds_the_subspaces_and_components():
  """Clean data lie on the subspaces: the start is near the true score already."""
  mix = sm.make_mixture(2, 16, 3, 2, 2)
  data = sm.sample(mix, 600, 3)
  for model in (
    sn.MoELatentMoG(16, 3, 2, 2, rngs=nnx.Rngs(0)),
    sn.MoELatentGaussian(16, 3, 2, rngs=nnx.Rngs(0)),
  ):
    before = sm.score_error(model, mix, 0.5, num_samples=512)
    sn.init_from_data(model, data, seed=1)
    bases = sn.orthonormal(model.bases_raw[...])
    overlap = np.linalg.norm(np.einsum("kDi,jDl->kjil", mix.bases, bases), axis=(2, 3)) ** 2
    np.testing.assert_allclose(np.sort(overlap.max(1)), 2.0, atol=1e-4)  # each U_k found
    after = sm.score_error(model, mix, 0.5, num_samples=512)
    assert after < 0.1 * before, (before, after)


def test_mlp_width_matches_the_parameter_count():
  model = sn.ScoreMLP(64, sn.mlp_width(852, 64), rngs=nnx.Rngs(0))
  assert abs(sn.count_params(model) - 852) <= 65
  assert sn.count_params(sn.MoELatentMoG(64, 3, 4, 3, rngs=nnx.Rngs(0))) == 852


def test_refusals():
  mix = sm.make_mixture(0, 6, 2, 2, 2)
  x = sm.sample(mix, 4, 0)
  model = sn.MoELatentMoG(6, 2, 2, 2, rngs=nnx.Rngs(0))
  for call in (
    lambda: sm.molr_mog_score(x, -0.5, mix),
    lambda: sm.molr_mog_log_density(x, -0.5, mix),
    lambda: sm.score_error(model, mix, -0.5),
    lambda: model(x, -0.5),
    lambda: sn.MoELatentGaussian(6, 2, 2, rngs=nnx.Rngs(0))(x, -0.5),
    lambda: sn.ScoreMLP(6, 3, rngs=nnx.Rngs(0))(x, -0.5),
    lambda: sn.dsm_loss(model, x, jnp.array([1.0, 1.0, -0.5, 1.0]), x),
  ):
    with pytest.raises(ConfigError, match="sigma=-0.5"):
      call()
  with pytest.raises(ConfigError, match="sigma=0 must be > 0"):
    sm.molr_mog_score(x, 0.0, mix)
  with pytest.raises(ConfigError, match=r"sigma of shape \(3,\)"):
    sm.molr_mog_score(x, jnp.ones(3), mix)
  with pytest.raises(ConfigError, match=r"x of shape \(4, 5\) must be \[n, D=6\]"):
    sm.molr_mog_score(x[:, :5], 1.0, mix)
  with pytest.raises(ConfigError, match=r"x of shape \(6,\)"):
    model(x[0], 1.0)
  with pytest.raises(ConfigError, match=r"means of shape \(2, 3, 2\)"):
    sm.molr_mog_score(x, 1.0, mix._replace(means=jnp.zeros((2, 3, 2))))
  with pytest.raises(ConfigError, match="orthonormal"):
    sm.molr_mog_score(x, 1.0, mix._replace(bases=2 * mix.bases))
  with pytest.raises(ConfigError, match="latent_dim=7"):
    sm.make_mixture(0, 6, 2, 7, 2)
  with pytest.raises(ConfigError, match="sigma_range"):
    sn.train_dsm(model, x, steps=1, sigma_range=(-1.0, 2.0))
  with pytest.raises(ConfigError, match="steps=0"):
    sn.train_dsm(model, x, steps=0)


@pytest.mark.parametrize("degrees", [1e-4, 0.5, 17.0, 89.0])
def test_subspace_angle_is_the_rotation_under_the_best_matching(degrees):
  """Subspace 1 of 3 turned by a known angle in a plane leaving the others: the largest
  principal angle is that angle, whatever order the learned experts come in."""
  rng = np.random.default_rng(0)
  q = np.linalg.qr(rng.standard_normal((12, 12)))[0]
  true = np.stack([q[:, 0:2], q[:, 2:4], q[:, 4:6]])
  theta = np.radians(degrees)
  learned = true.copy()
  learned[1, :, 0] = np.cos(theta) * q[:, 2] + np.sin(theta) * q[:, 9]  # out of every U_k
  for order in ([0, 1, 2], [2, 0, 1]):
    assert molr_mog.subspace_angle(true, learned[order]) == pytest.approx(
      degrees, rel=1e-6, abs=1e-9
    )
  assert molr_mog.subspace_angle(true, true[[1, 2, 0]]) == pytest.approx(0.0, abs=1e-6)
  with pytest.raises(ConfigError, match="model='unet' is not known"):
    molr_mog.build("unet", 0, jnp.zeros((4, 6)), dim=6, subspaces=2, latent_dim=2, components=2)


@pytest.mark.parametrize(
  "scale, want", [(1.0, 0.0), (0.0, 1.0), (2.0, 1.0), (1.5, 0.25), (-1.0, 4.0)]
)
def test_score_error_of_a_scaled_true_score_is_the_squared_relative_gap(scale, want):
  """s_theta = c s_true on the same samples: |c s - s|^2 / |s|^2 = (c - 1)^2 exactly,
  whatever the Monte Carlo draw (0 at the truth, 1 for a zero network)."""
  mix = random_mixture(2, dim=5, k=2, d=3, comps=2)

  def fn(x, sigma):
    return scale * sm.molr_mog_score(x, sigma, mix)

  assert sm.score_error(fn, mix, 0.3, num_samples=256, seed=4) == pytest.approx(want, abs=1e-5)


def test_the_default_instance_is_the_documented_one():
  """make_mixture with no scales: latent means N(0, 3^2 I) (800 draws: sample std
  within 0.4 of 3; 6 or 1.5 would be far outside), covariances exactly I, weights
  equal, bases orthonormal [K, D, d] at unequal sizes K=4, D=9, d=2."""
  mix = sm.make_mixture(11, 9, 4, 2, 100)
  assert mix.bases.shape == (4, 9, 2) and mix.means.shape == (4, 100, 2)
  assert abs(float(np.std(np.asarray(mix.means))) - 3.0) < 0.4
  np.testing.assert_array_equal(np.asarray(mix.covariances), 1.0)
  np.testing.assert_allclose(np.asarray(mix.weights), 0.25)
  np.testing.assert_allclose(np.asarray(mix.component_weights), 0.01)
  gram = np.einsum("kDd,kDe->kde", np.asarray(mix.bases), np.asarray(mix.bases))
  np.testing.assert_allclose(gram, np.broadcast_to(np.eye(2), gram.shape), atol=1e-5)
