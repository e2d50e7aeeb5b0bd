"""DPSL (loss 'dpsl'): the Beta-marginal CDF against closed forms, Dirichlet rows
vs uniform rows, symmetric / asymmetric / per-token priors, and gradient descent
on free logits driving every expert's KS statistic below 0.05."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from moejax.losses import get_loss, loss_config
from moejax.losses.dpsl import dpsl_loss, ks_statistics, pit_values
from moejax.routing import call_router
from tests.helpers import moe_cfg, random_logits

T, E = 2000, 4


def test_beta_cdf_matches_closed_form_and_quadrature():
  x = np.linspace(0.01, 0.99, 7)
  probs = jnp.asarray(np.tile(x[:, None], (1, E)), jnp.float32)
  # alpha = 1: marginal Beta(1, E - 1), F(x) = 1 - (1 - x)^(E - 1)
  np.testing.assert_allclose(pit_values(probs, 1.0)[:, 0], 1 - (1 - x) ** (E - 1), rtol=1e-5)
  # asymmetric: Beta(a, A - a) by trapezoid quadrature (b > 1 here); for a < 1 in
  # s = t^a, where the integrand (1 - s^(1/a))^(b-1) / a has no singularity at 0.
  alpha = np.array([0.5, 1.0, 2.0, 3.5])
  u = np.asarray(pit_values(probs, alpha))
  for e, a in enumerate(alpha):
    b = alpha.sum() - a
    c = min(a, 1.0)

    def integral(upper):
      s = np.linspace(0.0, upper**c, 20_001)
      t = s ** (1 / c)
      f = t ** (a - c) * (1 - t) ** (b - 1)
      return np.sum((f[1:] + f[:-1]) / 2 * np.diff(s))

    want = np.array([integral(v) for v in x]) / integral(1.0)
    np.testing.assert_allclose(u[:, e], want, atol=1e-5)


@pytest.mark.parametrize("alpha", [1.0, 0.75, (0.5, 1.0, 2.0, 3.5)])
def test_dirichlet_rows_score_low_uniform_rows_high(alpha):
  rng = np.random.default_rng(0)
  a = np.broadcast_to(np.asarray(alpha, np.float64), (E,))
  rows = jnp.asarray(rng.dirichlet(a, size=T), jnp.float32)
  low = float(dpsl_loss(rows, alpha))
  # CvM: E[loss] ~ E / (6T); the 99th percentile per expert is ~0.74 / T
  assert low < E * 0.75 / T, low
  high = float(dpsl_loss(jnp.full((T, E), 1.0 / E), alpha))
  assert high > 0.1 and high > 100 * low


def test_per_token_priors():
  """Two 'modalities' with opposite asymmetric priors: each row scored under its own prior."""
  rng = np.random.default_rng(1)
  prior_a, prior_b = np.array([2.0, 2.0, 0.5, 0.5]), np.array([0.5, 0.5, 2.0, 2.0])
  is_a = np.arange(T) % 2 == 0
  rows = np.where(is_a[:, None], rng.dirichlet(prior_a, T), rng.dirichlet(prior_b, T))
  alpha = np.where(is_a[:, None], prior_a, prior_b)
  rows = jnp.asarray(rows, jnp.float32)
  right = float(dpsl_loss(rows, alpha))
  wrong = float(dpsl_loss(rows, alpha[::-1]))
  assert right < E * 0.75 / T and wrong > 20 * right, (right, wrong)


@pytest.mark.integration
@pytest.mark.parametrize("alpha,steps", [(0.75, 200), ((0.5, 1.0, 2.0, 4.0), 400)])
def test_gradient_descent_on_free_logits_reaches_ks_below_005(alpha, steps):
  alpha = jnp.asarray(alpha, jnp.float32)
  logits = 0.01 * jax.random.normal(jax.random.key(0), (512, E))
  opt = optax.adam(0.05)

  @jax.jit
  def train(logits):
    def step(carry, _):
      z, s = carry
      g = jax.grad(lambda z: dpsl_loss(jax.nn.softmax(z, -1), alpha))(z)
      u, s = opt.update(g, s)
      return (optax.apply_updates(z, u), s), None

    (logits, _), _ = jax.lax.scan(step, (logits, opt.init(logits)), None, length=steps)
    return logits

  before = np.asarray(ks_statistics(jax.nn.softmax(logits, -1), alpha))
  after = np.asarray(ks_statistics(jax.nn.softmax(train(logits), -1), alpha))
  assert before.min() > 0.3
  assert after.max() < 0.05, after


def test_ks_statistic_by_hand():
  # one expert column u = F(p) with alpha = 1, E = 2: Beta(1, 1), F(p) = p
  p = jnp.asarray([[0.1, 0.9], [0.5, 0.5], [0.8, 0.2]], jnp.float32)
  # sorted u = .1 .5 .8: D = max(1/3-.1, .5-1/3, 2/3-.5, .8-2/3, 1-.8) = 0.2333
  np.testing.assert_allclose(ks_statistics(p, 1.0)[0], 0.7 / 3, rtol=1e-5)


def test_registered_loss_works_with_any_router():
  logits = jnp.asarray(random_logits(0, 64, 8))
  for name in ("topk", "expert_choice"):
    cfg = moe_cfg(router=name)
    loss_cfg = loss_config("dpsl", cfg)
    loss = jax.jit(
      jax.value_and_grad(
        lambda z: get_loss("dpsl")(call_router(name, z, cfg, train=True), loss_cfg)
      )
    )
    value, g = loss(logits)
    assert value.dtype == jnp.float32 and np.isfinite(float(value))
    assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).sum() > 0


def test_registered_loss_prior_router_then_config_then_symmetric_one():
  """The prior: the router's metrics['dpsl_alpha'], else model.moe.losses.dpsl.alpha, else 1."""
  from moejax.routing import RouterOutput

  rows = jnp.asarray(np.random.default_rng(2).dirichlet(np.ones(E), 16), jnp.float32)
  out = RouterOutput(None, jnp.log(rows), rows, {}, {})
  loss = get_loss("dpsl")
  np.testing.assert_allclose(loss(out, None), dpsl_loss(rows, 1.0), rtol=1e-6)
  cfg = loss_config("dpsl", moe_cfg(losses=dict(dpsl=dict(alpha=0.3))))
  np.testing.assert_allclose(loss(out, cfg), dpsl_loss(rows, 0.3), rtol=1e-6)
  assert abs(float(dpsl_loss(rows, 0.3)) - float(dpsl_loss(rows, 1.0))) > 1e-3
  routed = out.replace(metrics={"dpsl_alpha": jnp.asarray([0.5, 1.0, 2.0, 3.5])})
  np.testing.assert_allclose(
    loss(routed, cfg),
    dpsl_loss(rows, jnp.asarray([0.5, 1.0, 2.0, 3.5])),
    rtol=1e-6,
  )


def test_one_hot_rows_keep_finite_gradients():
  # Probabilities of exactly 0 and 1 are clipped to [1e-6, 1 - 1e-6] before the Beta
  # CDF, whose density is infinite at 0 when a < 1 and at 1 when b = A - a < 1.
  alpha = jnp.asarray([0.5, 0.1, 0.1, 0.1])  # a < 1 everywhere, b = 0.3 for expert 0
  rows = jnp.asarray(np.eye(E)[[0, 0, 1, 2, 3, 0]], jnp.float32)
  value, grad = jax.value_and_grad(lambda p: dpsl_loss(p, alpha))(rows)
  assert np.isfinite(float(value))
  assert np.isfinite(np.asarray(grad)).all()
  # and the clipped values are what the CDF reads: F(1 - 1e-6) = 0.988 for b = 0.3,
  # F(1e-6) = 0.237 for a = 0.1 (not 1 and 0)
  u = np.asarray(pit_values(rows, alpha))
  np.testing.assert_allclose([u[0, 0], u[0, 1]], [0.98835, 0.23681], rtol=1e-3)


def test_ks_statistic_above_and_below_the_ecdf():
  # E = 2, alpha = 1: u = p. p, column 0 (sorted u = .5 .9): the largest gap lies above
  # the empirical CDF's left limit, D = .5 - 0; column 1 (u = .1 .5): below its right
  # limit, D = 1 - .5. q: column 0 (u = .7 .8) D = .7 - 0; column 1 (u = .2 .3) D = 1 - .3.
  p = jnp.asarray([[0.5, 0.5], [0.9, 0.1]], jnp.float32)
  np.testing.assert_allclose(ks_statistics(p, 1.0), [0.5, 0.5], rtol=1e-5)
  q = jnp.asarray([[0.8, 0.2], [0.7, 0.3]], jnp.float32)
  np.testing.assert_allclose(ks_statistics(q, 1.0), [0.7, 0.7], rtol=1e-5)


def test_cramer_von_mises_by_hand():
  # E = 2, alpha = 1: u = p. Sorted columns (.1 .5 .8) and (.2 .5 .9) against the
  # midpoints (i - 1/2) / 3 = 1/6, 1/2, 5/6: each column's mean square is
  # ((1/15)^2 + 0 + (1/30)^2) / 3 = 1/540, the loss 2/540 = 1/270.
  p = jnp.asarray([[0.1, 0.9], [0.5, 0.5], [0.8, 0.2]], jnp.float32)
  np.testing.assert_allclose(dpsl_loss(p, 1.0), 1 / 270, rtol=1e-5)
