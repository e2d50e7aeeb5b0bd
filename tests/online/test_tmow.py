"""TMoW (moejax/online/tmow.py): refined prototypes are convex
combinations of the old ones (by the returned weights and by support functions);
the weights are softmax(cos / tau) by hand; an unseen domain equal to a training
domain gets that domain's expert; adding an expert keeps the old experts,
prototypes and routing; the distilled expert solves its normal equations and
spans least squares (strength 0) to the teacher (strength -> inf); the exact
excess MSE matches sampling; refusals name the value."""

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.online import tmow

N, DOMAINS, SIGMA = 4, 3, 0.1


def world(seed=0, count=400):
  """(true A_d [D, n, n], trained WorldModels, rng) of DOMAINS random domains."""
  rng = np.random.default_rng(seed)
  a = tmow.stable_matrices(rng, DOMAINS, N)
  models = tmow.train_world_models([tmow.transitions(rng, a_d, count, SIGMA) for a_d in a])
  return a, models, rng


@pytest.mark.parametrize("seed,tau", [(0, 0.05), (1, 0.3), (2, 3.0)])
def test_refined_prototype_is_a_convex_combination(seed, tau):
  a, models, rng = world(seed)
  z = tmow.features(*tmow.transitions(rng, tmow.mixture_matrix(a, [0.2, 0.5, 0.3]), 16, SIGMA))
  refined, w = tmow.refine_prototype(models.prototypes, z, tau)
  assert w.shape == (DOMAINS,) and (w >= 0).all() and w.sum() == pytest.approx(1.0, abs=1e-12)
  np.testing.assert_allclose(refined, w @ models.prototypes, rtol=1e-12, atol=1e-15)
  # softmax(cos(mean z, c_d) / tau), by hand in float64 (the router's float32 math)
  zbar = z.mean(0)
  cos = (
    models.prototypes @ zbar / (np.linalg.norm(models.prototypes, axis=1) * np.linalg.norm(zbar))
  )
  want = np.exp(cos / tau - np.max(cos / tau))
  np.testing.assert_allclose(w, want / want.sum(), rtol=2e-5, atol=1e-7)
  # in the hull, whatever the weights say: <u, c_new> <= max_d <u, c_d> for any u
  u = rng.standard_normal((500, refined.size))
  assert (u @ refined <= (u @ models.prototypes.T).max(1) + 1e-9).all()
  assert (u @ refined >= (u @ models.prototypes.T).min(1) - 1e-9).all()


@pytest.mark.parametrize("d", range(DOMAINS))
def test_an_unseen_domain_equal_to_a_training_one_recovers_its_expert(d):
  a, models, rng = world(3)
  z = tmow.features(*tmow.transitions(rng, a[d], 2000, SIGMA))
  _, w = tmow.refine_prototype(models.prototypes, z, tau=0.02)
  assert np.argmax(w) == d and w[d] > 0.99
  mixture = tmow.mixture_matrix(models.experts, w)
  np.testing.assert_allclose(mixture, models.experts[d], atol=0.02)
  other = models.experts[(d + 1) % DOMAINS]
  assert tmow.excess_mse(mixture, a[d], SIGMA) < tmow.excess_mse(other, a[d], SIGMA)
  top1 = tmow.route_weights(models.prototypes, z, tau=0.02, top_k=1)
  np.testing.assert_array_equal(top1, np.eye(DOMAINS)[d])


def test_adding_an_expert_keeps_old_experts_prototypes_and_routing():
  a, models, rng = world(4)
  far = -a.mean(0) * 3  # its prototype points away from every old one
  x, y = tmow.transitions(rng, far, 8, SIGMA)
  grown, teacher = tmow.add_expert(models, x, y, tau=0.1)
  assert grown.experts.shape == (DOMAINS + 1, N, N) and grown.prototypes.shape[0] == DOMAINS + 1
  np.testing.assert_array_equal(grown.experts[:DOMAINS], models.experts)
  np.testing.assert_array_equal(grown.prototypes[:DOMAINS], models.prototypes)
  np.testing.assert_allclose(grown.prototypes[-1], tmow.features(x, y).mean(0))
  assert teacher.shape == (DOMAINS,) and teacher.sum() == pytest.approx(1.0)
  for d in range(DOMAINS):  # an old prototype still routes to its own expert
    w = tmow.route_weights(grown.prototypes, grown.prototypes[d], tau=0.1, top_k=1)
    np.testing.assert_array_equal(w, np.eye(DOMAINS + 1)[d])
    fresh = tmow.features(*tmow.transitions(rng, a[d], 64, SIGMA))  # and so do its inputs
    before = tmow.route_weights(models.prototypes, fresh, tau=0.1)
    after = tmow.route_weights(grown.prototypes, fresh, tau=0.1)
    assert np.argmax(after) == np.argmax(before) == d
  z_new = tmow.features(*tmow.transitions(rng, far, 64, SIGMA))  # the new domain: new expert
  assert np.argmax(tmow.route_weights(grown.prototypes, z_new, tau=0.1)) == DOMAINS


def test_the_distilled_expert_fits_data_plus_teacher():
  a, models, rng = world(5)
  x, y = tmow.transitions(rng, tmow.mixture_matrix(a, [0.6, 0.4, 0.0]), 3, SIGMA)  # K < n
  w = np.array([0.5, 0.25, 0.25])
  teacher = tmow.mixture_matrix(models.experts, w)
  for strength in (0.1, 2.0):
    grown, _ = tmow.add_expert(models, x, y, tau=0.1, strength=strength, teacher_weights=w)
    new = grown.experts[-1]  # gradient of the objective: (A X^T - Y^T) X + s (A - T) = 0
    np.testing.assert_allclose((new @ x.T - y.T) @ x + strength * (new - teacher), 0, atol=1e-10)
  huge, _ = tmow.add_expert(models, x, y, tau=0.1, strength=1e9, teacher_weights=w)
  np.testing.assert_allclose(huge.experts[-1], teacher, atol=1e-7)
  many = tmow.transitions(rng, a[0], 50, SIGMA)
  none, _ = tmow.add_expert(models, *many, tau=0.1, strength=0.0)
  np.testing.assert_allclose(none.experts[-1], tmow.fit_expert(*many), atol=1e-12)
  x_test = rng.standard_normal((5, N))
  np.testing.assert_allclose(tmow.predict(models, w, x_test), x_test @ teacher.T, atol=1e-12)


def test_exact_excess_mse_matches_sampling_and_prototypes_estimate_dynamics():
  a, models, rng = world(6, count=4000)
  assert np.allclose(np.linalg.norm(a, ord=2, axis=(1, 2)), 0.9)
  x, y = tmow.transitions(rng, a[0], 200_000, SIGMA)
  empirical = np.mean(np.sum((x @ models.experts[1].T - y) ** 2, 1)) / (N * SIGMA**2) - 1
  exact = tmow.excess_mse(models.experts[1], a[0], SIGMA)
  assert empirical == pytest.approx(exact, rel=0.02)
  assert tmow.excess_mse(a[0], a[0], SIGMA) == 0.0
  # E vec(x' x^T) = vec(A) for x ~ N(0, I): per-entry std of the mean <= ~1.5 / sqrt(4000)
  np.testing.assert_allclose(models.prototypes, a.reshape(DOMAINS, -1), atol=0.1)


@pytest.mark.parametrize(
  "call,match",
  [
    (lambda m: tmow.refine_prototype(m.prototypes, m.prototypes, 0.0), r"tau=0\.0"),
    (lambda m: tmow.refine_prototype(m.prototypes, m.prototypes, -2), r"tau=-2"),
    (
      lambda m: tmow.refine_prototype(m.prototypes, np.ones((3, 5)), 0.1),
      r"features shape \(3, 5\)",
    ),
    (
      lambda m: tmow.add_expert(m, np.ones((3, N)), np.ones((3, N + 1)), 0.1),
      rf"x_next shape \(3, {N + 1}\)",
    ),
    (
      lambda m: tmow.add_expert(m, np.ones((3, N)), np.ones((3, N)), 0.1, strength=-1.0),
      r"strength=-1\.0",
    ),
    (lambda m: tmow.transitions(np.random.default_rng(0), m.experts[0], 4, 0.0), r"noise_std=0\.0"),
    (lambda m: tmow.stable_matrices(np.random.default_rng(0), 2, N, radius=1.0), r"radius=1\.0"),
    (lambda m: tmow.fit_expert(np.ones((2, N)), np.ones((2, N))), r"K=2, ridge=0\.0"),
    (lambda m: tmow.route_weights(m.prototypes, m.prototypes, 0.1, top_k=0), r"top_k=0"),
    (lambda m: tmow.mixture_matrix(m.experts, [1.0]), r"weights shape \(1,\)"),
    (
      lambda m: tmow.unseen_domain_errors(np.random.default_rng(0), [2], domains=1),
      r"^domains=1 must be an integer >= 2",
    ),
    (lambda m: tmow.unseen_domain_errors(np.random.default_rng(0), [0]), r"^shots=0"),
    (
      lambda m: tmow.check_settings(
        dim=2,
        domains=2,
        train=5,
        unseen=1,
        noise_std=0.1,
        radius=0.5,
        concentration=1.0,
        tau=0.0,
        strength=1.0,
      ),
      r"^tau=0\.0 must be a finite number > 0",
    ),
  ],
)
def test_refusals_name_the_value(call, match):
  _, models, _ = world(7, count=20)
  with pytest.raises(ConfigError, match=match):
    call(models)


LOWEST = dict(
  dim=1,
  domains=2,
  train=1,
  unseen=1,
  noise_std=1e-12,
  radius=1e-9,
  concentration=1e-12,
  tau=1e-12,
  strength=0.0,
)


def test_settings_at_their_lower_bounds_are_accepted():
  """dim 1, two domains, one training transition, one unseen domain and strength 0
  are usable settings (each bound is inclusive)."""
  tmow.check_settings(**LOWEST)


@pytest.mark.parametrize(
  "key, value, match",
  [
    ("dim", 0, r"^dim=0 must be an integer >= 1"),
    ("domains", 1, r"^domains=1 must be an integer >= 2"),
    ("train", 0, r"^train=0 must be an integer >= 1"),
    ("unseen", 0, r"^unseen=0 must be an integer >= 1"),
    ("noise_std", 0.0, r"^noise_std=0\.0 must be a finite number > 0"),
    ("concentration", 0.0, r"^concentration=0\.0 must be a finite number > 0"),
    ("strength", -1e-12, r"^strength=-1e-12 must be a finite number >= 0"),
    ("radius", 0.0, r"^radius=0\.0 must be in \(0, 1\)"),
    ("radius", 1.0, r"^radius=1\.0 must be in \(0, 1\)"),
  ],
)
def test_one_step_past_each_lower_bound_is_refused(key, value, match):
  with pytest.raises(ConfigError, match=match):
    tmow.check_settings(**{**LOWEST, key: value})


def test_the_studys_routing_diagnostics_on_well_separated_domains():
  """Unseen domains that are near-even mixtures (concentration 100) of 3 well
  separated domains: the distilled expert is every unseen domain's top-1, and adding
  it changes the top-1 expert of no fresh old-domain feature mean
  (old_routing_kept = 1, the fraction of *unchanged* top-1 choices)."""
  out = tmow.unseen_domain_errors(
    np.random.default_rng(0),
    [400],
    dim=3,
    domains=3,
    train=400,
    unseen=3,
    noise_std=0.05,
    concentration=100.0,
    tau=0.05,
  )
  assert out[("old_routing_kept", 400)] == 1.0
  assert out[("top1_is_new", 400)] == 1.0
  assert 0.5 < out[("weight_on_new", 400)] <= 1.0
