"""The calibrated Bayesian MoE's functions (moejax/continual/bayesian_moe.py) against closed
forms: the router ascending U on a fixed utility table converges to softmax(u / lambda)
(the maximiser of U = -lambda KL(q || softmax(u / lambda)) + const), lambda = 0 routes
one-hot on argmax u, BMA is the hand-summed mixture, ECE a case worked by hand, the
task router is the hard baseline; bad input is refused in one line naming it."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from moejax.continual import bayesian_moe as bm
from moejax.errors import ConfigError

# 4 queries (one-hot features: one free logit row each), 3 experts
U = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0], [0.3, 0.9, 0.5]], np.float32)
FEATURES = np.eye(4, dtype=np.float32)


def fitted_routing(lam, steps=3000, lr=1.0, available=None):
  router = bm.Router(4, 3)
  router = bm.fit_router(router, FEATURES, available, optax.sgd(lr), steps, utilities=U, lam=lam)
  return bm.routing_of(router, FEATURES, available)


@pytest.mark.parametrize("lam", [0.5, 1.0, 2.0])
def test_the_router_ascending_u_converges_to_softmax_of_u_over_lambda(lam):
  z = np.exp(U / lam)
  expected = z / z.sum(-1, keepdims=True)
  np.testing.assert_allclose(fitted_routing(lam), expected, atol=1e-4)
  np.testing.assert_allclose(bm.optimal_routing(U, lam), expected, rtol=1e-6)


def test_the_converged_router_maximises_u_among_nearby_routings():
  lam = 0.5
  q = bm.optimal_routing(U, lam)
  best = float(bm.expected_utility(q, U, lam))
  assert float(bm.expected_utility(fitted_routing(lam), U, lam)) == pytest.approx(best, abs=1e-6)
  rng = np.random.default_rng(0)
  for _ in range(50):
    other = q * np.exp(0.1 * rng.standard_normal(q.shape))
    other /= other.sum(-1, keepdims=True)
    assert float(bm.expected_utility(other, U, lam)) < best


def test_unavailable_experts_get_no_mass_and_the_rest_is_softmax():
  available = np.array([True, False, True])
  q = fitted_routing(1.0, available=available)
  np.testing.assert_array_equal(q[:, 1], 0.0)
  z = np.exp(U[:, [0, 2]])
  np.testing.assert_allclose(q[:, [0, 2]], z / z.sum(-1, keepdims=True), atol=1e-4)
  np.testing.assert_allclose(bm.optimal_routing(U, 1.0, available), q, atol=1e-4)


def test_rows_left_out_by_the_mask_are_as_if_absent():
  features = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
  rows = np.array([True, False, True, True])

  def fit(f, u, mask=None):
    router = bm.fit_router(
      bm.Router(3, 3), f, None, optax.sgd(0.5), 200, utilities=u, lam=0.5, rows_N=mask
    )
    return bm.routing_of(router, features)

  np.testing.assert_allclose(fit(features, U, rows), fit(features[rows], U[rows]), atol=1e-6)
  assert not np.allclose(fit(features, U), fit(features[rows], U[rows]), atol=1e-3)


def test_lambda_zero_routes_one_hot_on_the_argmax_of_u():
  untied = U[[0, 3]]
  np.testing.assert_array_equal(bm.optimal_routing(untied, 0.0), [[1, 0, 0], [0, 1, 0]])
  ties = bm.optimal_routing(U[[1, 2]], 0.0)  # equal mass on the tied best
  np.testing.assert_allclose(ties, [[0.5, 0.5, 0], [1 / 3] * 3], rtol=1e-7)
  q = fitted_routing(0.0, steps=3000, lr=10.0)
  assert q[0, 0] > 0.999 and q[3, 1] > 0.99  # the argmax, towards one-hot
  assert fitted_routing(1.0)[3, 1] < 0.5  # lambda > 0 keeps mass on the others


def test_bma_is_the_weighted_sum_by_hand():
  q = np.array([[0.2, 0.8], [1.0, 0.0]], np.float32)  # 2 queries, 2 experts
  p = np.array(
    [[[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]], [[0.0, 1.0, 0.0], [0.3, 0.3, 0.4]]], np.float32
  )  # [expert, query, answer]
  expected = [[0.2 * 0.5 + 0.8 * 0.0, 0.2 * 0.5 + 0.8 * 1.0, 0.0], [0.1, 0.2, 0.7]]
  np.testing.assert_allclose(bm.bma(q, p), expected, rtol=1e-6)
  with pytest.raises(ValueError, match=r"\(2, 2\)"):
    bm.bma(q, p[:, :1])


def test_ece_of_a_case_worked_by_hand():
  probs = np.array(
    [
      [0.92, 0.08, 0.0],  # label 0: right, confidence 0.92
      [0.81, 0.19, 0.0],  # label 1: wrong, 0.81
      [0.58, 0.42, 0.0],  # label 0: right, 0.58
      [0.52, 0.48, 0.0],  # label 0: right, 0.52
      [0.31, 0.31, 0.38],  # label 0: wrong (answers 2), 0.38
    ]
  )
  labels = np.array([0, 1, 0, 0, 0])
  # 2 bins (0, 0.5], (0.5, 1]: the upper holds 4 rows, accuracy 3/4, mean confidence
  # 2.83 / 4 = 0.7075; the lower one row, accuracy 0, confidence 0.38.
  # ECE = 4/5 * 0.0425 + 1/5 * 0.38 = 0.034 + 0.076 = 0.11
  assert bm.ece(probs, labels, n_bins=2) == pytest.approx(0.11, abs=1e-12)
  # 10 bins: 0.92 | 0.81 | 0.58 and 0.52 together in (0.5, 0.6] | 0.38
  by_hand = (0.08 + 0.81 + 2 * abs(1 - 0.55) + 0.38) / 5
  assert bm.ece(probs, labels, n_bins=10) == pytest.approx(by_hand, abs=1e-12)
  # bins are closed on the right: 0.5 falls in (0, 0.5], apart from 0.6
  edge = np.array([[0.5, 0.5], [0.6, 0.4]])
  assert bm.ece(edge, [0, 1], n_bins=2) == pytest.approx((0.5 + 0.6) / 2, abs=1e-12)
  assert bm.ece(np.array([[1.0, 0.0], [0.0, 1.0]]), [0, 1]) == 0.0


def test_the_task_router_learns_the_task_and_routes_one_hot():
  tasks = np.array([2, 0, 1, 2])
  router = bm.fit_router(bm.Router(4, 3), FEATURES, None, optax.adam(0.1), 200, tasks=tasks)
  q = bm.hard_routing(np.log(bm.routing_of(router, FEATURES)))
  np.testing.assert_array_equal(q, np.eye(3)[tasks])
  np.testing.assert_array_equal(bm.hard_routing([[0.2, 0.2, 0.1]]), [[1, 0, 0]])


def test_accuracy_utilities_mark_the_right_experts():
  p = np.array([[[0.6, 0.4], [0.2, 0.8]], [[0.1, 0.9], [0.3, 0.7]]])  # [expert, query, answer]
  np.testing.assert_array_equal(bm.accuracy_utilities(p, [0, 1]), [[1, 0], [1, 1]])


def test_router_math_is_float32():
  router = bm.Router(4, 3)
  assert router(jnp.asarray(FEATURES, jnp.bfloat16)).dtype == jnp.float32
  assert bm.expected_utility(U.astype(np.float16), U, 0.5).dtype == jnp.float32


@pytest.mark.parametrize(
  "call, name",
  [
    (lambda: bm.optimal_routing(U, -0.1), "lam=-0.1"),
    (
      lambda: bm.fit_router(
        bm.Router(4, 3), FEATURES, None, optax.sgd(1.0), 5, utilities=U, lam=-1
      ),
      "lam=-1",
    ),  # fmt: skip
    (
      lambda: bm.fit_router(bm.Router(4, 3), FEATURES, None, optax.sgd(1.0), -5, utilities=U),
      "steps=-5",
    ),  # fmt: skip
    (lambda: bm.ece(U, [0, 1, 2, 0], n_bins=0), "n_bins=0"),
    (lambda: bm.check_lam(True), "lam=True"),
  ],
)
def test_bad_input_is_refused_in_one_line_naming_it(call, name):
  with pytest.raises(ConfigError) as error:
    call()
  assert "\n" not in str(error.value) and name in str(error.value)
