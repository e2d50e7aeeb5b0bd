"""Mixtures on spheres (moejax/mixtures/sphere.py, MGFA ICML 2026) against oracles:
Exp and Log inverse to each other, Frechet means of symmetric sets and the
first-order condition, the tangent density against a dense Gaussian and its
integral over the sphere, q = 0 against an isotropic tangent Gaussian by hand,
monotone EM, parameter recovery, the vMF normaliser by quadrature, ARI by pair
counting, a Gaussian's mass on the sphere in closed form, the synthetic bands' tangent
spread, best-of-restarts fits, and the refusals."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import integrate, special, stats

from moejax.errors import ConfigError
from moejax.evaluation.partitions import adjusted_rand_index
from moejax.mixtures import gmm, sphere_compare, synthetic
from moejax.mixtures import sphere as sp

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


def unit(rng, *shape):
  x = rng.standard_normal(shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def tangent(rng, mu, n, norms):
  """n tangent vectors at mu with the given norms."""
  v = rng.standard_normal((n, len(mu)))
  v -= (v @ mu)[:, None] * mu
  return v / np.linalg.norm(v, axis=1, keepdims=True) * np.asarray(norms)[:, None]


@settings(max_examples=25)
@given(st.sampled_from([2, 3, 5, 11, 64]), st.integers(0, 2**31 - 1))
def test_exp_of_log_and_log_of_exp_are_the_identity(d, seed):
  rng = np.random.default_rng(seed)
  with jax.enable_x64(True):
    mu, x = unit(rng, d), unit(rng, 50, d)
    x[0], x[1] = mu, -np.cos(1e-4) * mu + np.sin(1e-4) * tangent(rng, mu, 1, [1])[0]  # -mu
    v = sp.log_map(mu, x)
    np.testing.assert_allclose(sp.exp_map(mu, v), x, atol=1e-6)
    np.testing.assert_allclose(v @ mu, 0, atol=1e-12)  # tangent
    np.testing.assert_allclose(
      np.linalg.norm(v, axis=1), np.arccos(np.clip(x @ mu, -1, 1)), atol=1e-7
    )  # |Log| is the geodesic distance
    w = tangent(rng, mu, 50, rng.uniform(0, np.pi - 1e-3, 50))
    w[0] = 0
    np.testing.assert_allclose(sp.log_map(mu, sp.exp_map(mu, w)), w, atol=1e-6)
  x32 = unit(rng, 50, d).astype(np.float32)  # float32 away from the antipode
  x32 *= np.where(x32 @ mu.astype(np.float32) < -0.9, -1, 1).astype(np.float32)[:, None]
  np.testing.assert_allclose(sp.exp_map(mu, sp.log_map(mu.astype(np.float32), x32)), x32, atol=1e-6)


@pytest.mark.parametrize("d", [3, 11])
def test_frechet_mean_of_points_symmetric_about_a_centre_is_the_centre(d):
  rng = np.random.default_rng(d)
  with jax.enable_x64(True):
    centre = unit(rng, d)
    v = tangent(rng, centre, 20, rng.uniform(0.1, 1.2, 20))
    x = np.asarray(jnp.concatenate([sp.exp_map(centre, v), sp.exp_map(centre, -v)]))
    w = np.tile(rng.uniform(0.5, 2.0, 20), 2)  # equal weights within each pair
    far = np.asarray(sp.exp_map(centre, tangent(rng, centre, 1, [0.8])[0]))
    for weights in (None, w):
      mean = sp.frechet_mean(x, weights, init=far)
      assert float(sp.geodesic_distance(mean, centre)) < 1e-9
    batch = sp.frechet_mean(x, np.stack([w, np.ones(40)]), init=far)
    assert batch.shape == (2, d)
    assert float(jnp.max(sp.geodesic_distance(batch, centre))) < 1e-9


def test_frechet_mean_is_a_stationary_minimum_and_not_the_extrinsic_mean():
  rng = np.random.default_rng(0)
  with jax.enable_x64(True):
    centre = unit(rng, 4)
    lengths = rng.uniform(0, 1.3, 60) * np.r_[np.ones(40), 2 * np.ones(20)]  # skewed
    x = np.asarray(sp.exp_map(centre, tangent(rng, centre, 60, lengths)))
    w = rng.uniform(0.1, 1.0, 60)
    mean = sp.frechet_mean(x, w)
    grad = (w / w.sum()) @ np.asarray(sp.log_map(mean, x))
    assert np.linalg.norm(grad) < 1e-10

    def cost(m):
      return float(w @ sp.geodesic_distance(x, m) ** 2)

    for step in tangent(rng, np.asarray(mean), 20, np.full(20, 1e-3)):
      assert cost(sp.exp_map(mean, step)) > cost(mean)
    extrinsic = w @ x / np.linalg.norm(w @ x)
    assert float(sp.geodesic_distance(mean, extrinsic)) > 1e-3


def random_mgfa(rng, k, d, q):
  means = unit(rng, k, d)
  factors = np.stack([tangent(rng, m, q, rng.uniform(0.2, 0.8, q)).T for m in means])
  return sp.MGFA(
    jnp.asarray(rng.dirichlet(np.ones(k))),
    jnp.asarray(means),
    jnp.asarray(factors.reshape(k, d, q)),
    jnp.asarray(rng.uniform(0.05, 0.3, k)),
  )


@pytest.mark.parametrize("d,q", [(3, 1), (6, 2), (6, 0)])
def test_tangent_density_equals_a_dense_gaussian_in_a_tangent_basis(d, q):
  rng = np.random.default_rng(d + q)
  with jax.enable_x64(True):
    model = random_mgfa(rng, 1, d, q)
    mu, w, s2 = np.asarray(model.means[0]), np.asarray(model.factors[0]), float(model.noise[0])
    basis = np.linalg.svd(np.eye(d) - np.outer(mu, mu))[0][:, : d - 1]  # [d, d-1] tangent
    v = tangent(rng, mu, 30, rng.uniform(0, 2, 30))
    dense = stats.multivariate_normal(
      np.zeros(d - 1), basis.T @ (w @ w.T) @ basis + s2 * np.eye(d - 1)
    ).logpdf(v @ basis)
    np.testing.assert_allclose(sp.tangent_log_density(jnp.asarray(v), w, s2), dense, rtol=1e-10)


@pytest.mark.integration
def test_zero_factors_give_the_isotropic_tangent_gaussian():
  rng = np.random.default_rng(1)
  with jax.enable_x64(True):
    d = 5
    model = random_mgfa(rng, 2, d, 0)
    x = unit(rng, 40, d)
    by_hand = []
    for pi, mu, s2 in zip(model.weights, np.asarray(model.means), model.noise):
      theta = np.arccos(np.clip(x @ mu, -1, 1))
      log_n = -(d - 1) / 2 * np.log(2 * np.pi * s2) - theta**2 / (2 * s2)
      by_hand.append(np.log(pi) + log_n - (d - 2) * np.log(np.sin(theta) / theta))
    expect = special.logsumexp(np.stack(by_hand), axis=0).sum()
    np.testing.assert_allclose(sp.log_likelihood(x, model), expect, rtol=1e-10)
    # and its M step: sigma_k^2 = sum_n gamma_nk theta_nk^2 / ((d-1) N_k) at the kept mean
    resp, _ = sp.e_step(jnp.asarray(x), model)
    new = sp.mgfa_m_step(jnp.asarray(x), resp, model)
    theta = np.asarray(sp.geodesic_distance(x[:, None], new.means[None]))
    np.testing.assert_allclose(
      new.noise, (resp * theta**2).sum(0) / ((d - 1) * resp.sum(0)), rtol=1e-9
    )


@pytest.mark.parametrize("d", [3, 4])
def test_the_density_integrates_to_one_over_the_sphere_with_the_jacobian(d):
  """Uniform Monte Carlo over S^{d-1}: p integrates to P(|v| < pi) ~ 1; without the
  (sin r / r)^{d-2} factor it does not (~0.8 here)."""
  rng = np.random.default_rng(d)
  with jax.enable_x64(True):
    model = random_mgfa(rng, 1, d, 1)._replace(noise=jnp.asarray([0.15]))
    u = jnp.asarray(unit(rng, 400_000, d))
    area = 2 * np.pi ** (d / 2) / math.gamma(d / 2)
    dens = np.exp(np.asarray(sp.log_joint(u, model)[:, 0])) * area
    estimate, error = dens.mean(), dens.std() / np.sqrt(dens.size)
    assert error < 0.01 and abs(estimate - 1) < 4 * error + 1e-3
    v = sp.log_map(model.means[0], u)
    plain = np.exp(np.asarray(sp.tangent_log_density(v, model.factors[0], 0.15))) * area
    assert abs(plain.mean() - 1) > 0.08


def bands(seed, d, k=3, n=150):
  return synthetic.sphere_bands(
    np.random.default_rng(seed), d, k, n, spacing=0.4, major=0.5, minor=0.05
  )


@pytest.mark.parametrize("d,q", [(3, 1), (6, 2), (6, 0)])
def test_em_log_likelihood_never_decreases(d, q):
  with jax.enable_x64(True):
    x, _, _ = bands(d, d)
    x = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    for seed in range(2):
      _, history = sp.fit_mgfa(x, 3, q, seed=seed, max_steps=40, tol=0)
      assert np.all(np.diff(history) >= -1e-9 * np.abs(history[:-1])), np.diff(history).min()
      assert history[-1] > history[0] + 1.0
      for newton in (0, 2):
        _, history = sp.fit_vmf(x, 3, seed=seed, max_steps=40, tol=0, newton_steps=newton)
        assert np.all(np.diff(history) >= -1e-9 * np.abs(history[:-1]))


def test_mgfa_recovers_a_generating_component():
  rng = np.random.default_rng(5)
  with jax.enable_x64(True):
    truth = random_mgfa(rng, 1, 6, 1)._replace(noise=jnp.asarray([0.01]))
    mu, w = np.asarray(truth.means[0]), np.asarray(truth.factors[0])
    g = rng.standard_normal((8000, 6))
    v = rng.standard_normal((8000, 1)) @ w.T + 0.1 * (g - np.outer(g @ mu, mu))
    model, _ = sp.fit_mgfa(np.asarray(sp.exp_map(mu, v)), 1, 1)
    assert float(sp.geodesic_distance(model.means[0], mu)) < 0.01
    np.testing.assert_allclose(model.noise[0], 0.01, rtol=0.05)
    got = np.asarray(model.factors[0])
    np.testing.assert_allclose(got @ got.T, w @ w.T, atol=0.03 * np.sum(w * w))


def test_mgfa_separates_parallel_bands_that_the_vmf_mixture_cuts_across():
  x, labels, _ = bands(0, 3)
  mgfa, _ = sp.fit_mgfa(x, 3, 1, seed=0)
  vmf, _ = sp.fit_vmf(x, 3, seed=0)
  assert adjusted_rand_index(labels, sp.predict(x, mgfa)) > 0.95
  assert adjusted_rand_index(labels, sp.predict(x, vmf)) < 0.3


@pytest.mark.parametrize("d", [2, 3, 11, 40])
@pytest.mark.parametrize("kappa", [0.0, 1e-3, 0.7, 15.0, 900.0])
def test_vmf_normaliser_makes_the_density_integrate_to_one(d, kappa):
  """int_S C exp(kappa t) dS = C A_{d-2} int_{-1}^1 exp(kappa t) (1-t^2)^{(d-3)/2} dt."""
  log_c = float(sp.log_vmf_normaliser(kappa, d))
  ring = 2 * np.pi ** ((d - 1) / 2) / math.gamma((d - 1) / 2)

  def f(t):
    return np.exp(log_c + kappa * t) * (1 - t * t) ** ((d - 3) / 2)

  total = integrate.quad(f, -1, 1, points=[1 - 10 / max(kappa, 1)], limit=200)[0]
  np.testing.assert_allclose(ring * total, 1.0, rtol=1e-6)
  if d == 3:  # the closed form on S^2
    expect = (
      np.log(kappa / (2 * np.pi * (1 - np.exp(-2 * kappa)))) - kappa
      if kappa
      else -np.log(4 * np.pi)
    )
    np.testing.assert_allclose(log_c, expect, rtol=1e-9)


def test_banerjee_kappa_and_its_newton_refinement():
  for d in (3, 11):
    for kappa in (0.5, 5.0, 50.0, 5000.0):
      rbar = special.ive(d / 2, kappa) / special.ive(d / 2 - 1, kappa)  # A_d(kappa)
      np.testing.assert_allclose(sp.banerjee_kappa(rbar, d), kappa, rtol=0.1)
      np.testing.assert_allclose(sp.banerjee_kappa(rbar, d, newton_steps=8), kappa, rtol=1e-6)


def test_sphere_normaliser_of_a_gaussian_matches_closed_forms():
  rng = np.random.default_rng(0)
  for d, s2 in ((3, 0.5), (11, 2.0)):  # centred isotropic: N is constant on the sphere
    area = 2 * np.pi ** (d / 2) / math.gamma(d / 2)
    expect = np.log(area) - d / 2 * np.log(2 * np.pi * s2) - 1 / (2 * s2)
    np.testing.assert_allclose(
      sphere_compare.gaussian_log_normalisers(np.zeros((1, d)), [s2], rng), [expect], rtol=1e-9
    )
  m, s2 = np.array([[0.0, 0.9, 0.0]]), 0.05  # S^2, off-centre: 4 pi sinh(c) / c
  c = np.linalg.norm(m) / s2
  expect = (
    -1.5 * np.log(2 * np.pi * s2)
    - (1 + 0.81) / (2 * s2)
    + c
    + np.log(2 * np.pi / c)
    + np.log1p(-np.exp(-2 * c))
  )
  got = sphere_compare.gaussian_log_normalisers(m, [[s2] * 3], rng, samples=20000)
  np.testing.assert_allclose(got, [expect], atol=0.01)


X = unit(np.random.default_rng(0), 6, 3)
REFUSALS = [
  (lambda: sp.fit_mgfa(np.r_[X[:2], 1.01 * X[2:]], 2, 1), "first bad row 2"),
  (lambda: sp.fit_vmf(np.r_[X[:4], [[np.nan] * 3], X[5:]], 2), "first bad row 4"),
  (lambda: sp.frechet_mean(X * 0.5), "first bad row 0"),
  (lambda: sp.fit_mgfa(X, 0, 1), "K=0"),
  (lambda: sp.fit_mgfa(X, 7, 1), "K=7"),
  (lambda: sp.fit_vmf(X, 0), "K=0"),
  (lambda: sp.fit_vmf(X, 7), "K=7"),
  (lambda: sp.init_mgfa(X, 2, 2), "q=2"),
  (lambda: sp.init_mgfa(X, 2, -1), "q=-1"),
  (lambda: sp.fit_mgfa(X, 2, 1, max_steps=0), "max_steps=0"),
  (lambda: sp.frechet_mean(X, -np.ones(6)), "weights.shape=(6,)"),
  (lambda: sp.frechet_mean(X, np.ones(5)), "weights.shape=(5,)"),
  (lambda: sp.log_likelihood(X[0], sp.init_vmf(X, 2)), "x.shape=(3,)"),
  (lambda: sp.frechet_mean(X, init=2 * X[0]), "first bad row 0"),
  (lambda: sp.frechet_mean(X, init=X[:2]), "init.shape=(2, 3)"),
  (lambda: sp.frechet_mean(np.r_[X[:1], -X[:1]]), "give init"),
]


@pytest.mark.parametrize("call,value", REFUSALS)
def test_refusals_name_the_value_in_one_line(call, value):
  with pytest.raises(ConfigError) as error:
    call()
  assert value in str(error.value) and "\n" not in str(error.value)


def test_sphere_bands_spread_major_along_the_bands_and_minor_across():
  x, labels, means = synthetic.sphere_bands(
    np.random.default_rng(3), 6, 3, 20000, spacing=0.4, major=0.3, minor=0.05
  )
  assert x.dtype == np.float32 and x.shape == (60000, 6)
  np.testing.assert_allclose(np.linalg.norm(x.astype(np.float64), axis=1), 1, atol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(means, axis=1), 1, atol=1e-12)
  np.testing.assert_allclose(sp.geodesic_distance(means[1:], means[:-1]), 0.4, atol=1e-5)
  for j in range(3):
    v = np.asarray(sp.log_map(means[j], x[labels == j].astype(np.float64)))
    # the band's direction: tangent at every mean and orthogonal to their great circle
    u, s, vt = np.linalg.svd(v - v.mean(0), full_matrices=False)
    spread = s / np.sqrt(len(v))
    np.testing.assert_allclose(spread[0], 0.3, rtol=0.02)
    np.testing.assert_allclose(spread[1:5], 0.05, rtol=0.03)
    assert abs(vt[0] @ means[0]) < 0.02 and abs(vt[0] @ means[2]) < 0.02


def test_fit_best_keeps_the_restart_of_largest_training_likelihood():
  x, _, _ = bands(1, 3, n=60)
  seeds = [[0, r] for r in range(3)]
  finals = [sp.fit_vmf(x, 3, seed=s, max_steps=30)[1] for s in seeds]
  steps, model = sphere_compare.fit_best("vmf", x, 3, seeds, max_steps=30)
  best = int(np.argmax([h[-1] for h in finals]))
  assert steps == len(finals[best]) - 1
  np.testing.assert_allclose(sp.log_likelihood(x, model), finals[best][-1], rtol=1e-6)
  with pytest.raises(ConfigError, match="method"):
    sphere_compare.fit_best("kmeans", x, 3, seeds)


def test_a_centred_isotropic_gmm_restricted_to_the_sphere_is_uniform():
  d = 5
  x = unit(np.random.default_rng(0), 50, d).astype(np.float32)
  model = gmm.GMM(weights=jnp.ones(1), means=jnp.zeros((1, d)), variances=jnp.asarray([0.7]))
  area = 2 * np.pi ** (d / 2) / math.gamma(d / 2)
  got = sphere_compare.restricted_gmm_log_likelihood(x, model, np.random.default_rng(1))
  np.testing.assert_allclose(got, -np.log(area), rtol=1e-5)


def test_sphere_bands_axis_is_the_band_direction_and_the_sample_is_unchanged():
  x, labels, means = synthetic.sphere_bands(
    np.random.default_rng(5), 6, 3, 4000, spacing=0.4, major=0.3, minor=0.05
  )
  x2, labels2, means2, axis = synthetic.sphere_bands(
    np.random.default_rng(5), 6, 3, 4000, spacing=0.4, major=0.3, minor=0.05, with_axis=True
  )
  np.testing.assert_array_equal(x, x2)
  np.testing.assert_array_equal(means, means2)
  v = np.asarray(sp.log_map(means[1], x[labels == 1].astype(np.float64)))
  top = np.linalg.svd(v - v.mean(0), full_matrices=False)[2][0]
  assert abs(abs(top @ axis) - 1) < 1e-3 and np.abs(means @ axis).max() < 1e-12


def test_heavy_blobs_tangent_norms_follow_the_student_t_law():
  # |v|^2 / scale^2 = chi2_{d-1} / (chi2_df / df) = (d-1) F(d-1, df): KS against scipy
  d, scale, df = 5, 0.1, 3.0
  x, labels, means = synthetic.sphere_heavy_blobs(
    np.random.default_rng(2), d, 3, 3000, spacing=0.4, scale=scale, df=df
  )
  v = np.asarray(sp.log_map(means[labels], x.astype(np.float64)))
  r2 = np.sum(v**2, 1) / scale**2 / (d - 1)
  kept = np.sqrt(r2 * (d - 1)) * scale < 2.5  # Log is exact below pi (float32 rounding aside)
  p = stats.kstest(r2[kept], stats.f(d - 1, df).cdf).pvalue
  assert kept.mean() > 0.99 and p > 1e-3, p
  # heavy tails, unlike a Gaussian of the same scale: P(|v| > 4 scale sqrt(d-1)) by hand
  tail = np.mean(r2 > 16)
  np.testing.assert_allclose(tail, stats.f(d - 1, df).sf(16), atol=0.004)
  assert tail > 50 * stats.chi2(d - 1).sf(16 * (d - 1))
  with pytest.raises(ConfigError, match="df=0"):
    synthetic.sphere_heavy_blobs(np.random.default_rng(0), d, 3, 10, spacing=0.4, scale=0.1, df=0)


def test_mean_direction_error_matches_components_and_is_exact_at_small_angles():
  rng = np.random.default_rng(0)
  means = unit(rng, 3, 4)
  angles = np.array([1e-7, 0.2, 0.05])
  moved = []
  for m, a in zip(means, angles):  # rotate each mean by a known angle
    t = rng.standard_normal(4)
    t -= (t @ m) * m
    moved.append(np.cos(a) * m + np.sin(a) * t / np.linalg.norm(t))
  fitted = np.asarray(moved)[[2, 0, 1]]  # the fit's components in another order
  np.testing.assert_allclose(
    sphere_compare.mean_direction_error(means, fitted), angles.mean(), rtol=1e-9
  )
  assert sphere_compare.mean_direction_error(means[:1], moved[:1]) == pytest.approx(1e-7, rel=1e-6)


def test_fit_best_with_init_adds_the_started_fit_as_a_candidate():
  x, _, means, axis = synthetic.sphere_bands(
    np.random.default_rng(4), 3, 3, 80, spacing=0.4, major=0.5, minor=0.05, with_axis=True
  )
  truth = sp.MGFA(
    jnp.full(3, 1 / 3),
    jnp.asarray(means, x.dtype),
    jnp.asarray(0.5 * np.tile(axis[None, :, None], (3, 1, 1)), x.dtype),
    jnp.full(3, 0.05**2, x.dtype),
  )
  alone = sp.fit_mgfa(x, 3, 1, init=truth, max_steps=30)
  steps, model = sphere_compare.fit_best("mgfa", x, 3, [], max_steps=30, init=truth)
  np.testing.assert_allclose(model.means, alone[0].means)
  assert steps == len(alone[1]) - 1
  with pytest.raises(ConfigError, match="gmm_diag"):
    sphere_compare.fit_best("gmm_diag", x, 3, [[0]], init=truth)
