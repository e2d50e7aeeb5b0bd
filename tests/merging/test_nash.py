"""NAMEx's Nash-bargaining merge (moejax/merging/nash.py) against closed forms, the
bargaining optimality conditions and a brute-force search over directions."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moejax import merging
from moejax.errors import ConfigError
from moejax.merging.nash import nash_weights


def test_orthogonal_task_vectors_get_one_over_their_norm():
  norms = np.array([0.5, 2.0, 7.0])
  g = np.diag(norms)  # columns: orthogonal task vectors
  np.testing.assert_allclose(nash_weights(g.T @ g), 1 / norms, rtol=1e-14)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6))
def test_the_solution_meets_the_bargaining_conditions(seed, n):
  g = np.random.default_rng(seed).standard_normal((n + 3, n))  # independent columns
  alpha = nash_weights(g.T @ g)
  assert np.all(alpha > 0)
  np.testing.assert_allclose(g.T @ g @ alpha, 1 / alpha, rtol=1e-10)
  gains = (g @ alpha) @ g  # d^T tau_j
  np.testing.assert_allclose(gains, 1 / alpha, rtol=1e-10)
  assert np.all(gains > 0)


def test_symmetric_task_vectors_get_equal_weights():
  k = np.full((4, 4), 0.3) + 0.7 * np.eye(4)  # equal norms, equal pairwise angles
  alpha = nash_weights(k)
  np.testing.assert_allclose(alpha, alpha[0], rtol=1e-13)


def test_the_direction_is_the_brute_force_bargaining_optimum():
  taus = np.array([[1.0, 0.2], [-0.3, 1.5]]).T  # columns tau_1, tau_2 in the plane
  angles = np.linspace(-np.pi, np.pi, 200_001)
  d = np.stack([np.cos(angles), np.sin(angles)], 1)
  utility = d @ taus
  value = np.where(np.all(utility > 0, 1), np.log(np.clip(utility, 1e-300, None)).sum(1), -np.inf)
  best = angles[np.argmax(value)]
  direction = taus @ nash_weights(taus.T @ taus)
  assert abs(np.arctan2(direction[1], direction[0]) - best) < 1e-4


def test_bargaining_powers_weight_the_orthogonal_solution():
  np.testing.assert_allclose(
    nash_weights(np.diag([4.0, 9.0]), powers=[1.0, 4.0]), [0.5, 2 / 3], rtol=1e-14
  )


def test_the_merge_adds_scaled_nash_directions_to_the_base():
  base = {"w": np.zeros(3), "b": {"x": np.zeros(1)}}
  models = [
    {"w": np.array([2.0, 0, 0]), "b": {"x": np.zeros(1)}},
    {"w": np.array([0, 0, 0.5]), "b": {"x": np.zeros(1)}},
  ]
  merged = merging.bind("nash", {"scale": 3.0})(base, models)
  # alpha = 1/||tau||: each model adds its unit direction, times scale
  np.testing.assert_allclose(merged["w"], [3.0, 0, 3.0], rtol=1e-14)


def test_a_model_equal_to_the_base_takes_no_part():
  base = {"w": np.array([1.0, 1.0])}
  merged = merging.bind("nash")(base, [base, {"w": np.array([1.0, 5.0])}])
  np.testing.assert_allclose(merged["w"], [1.0, 2.0], rtol=1e-14)


def test_opposed_task_vectors_have_no_bargaining_solution():
  base = {"w": np.zeros(2)}
  with pytest.raises(ConfigError, match=r"--method=nash over models\[0\], models\[1\]: no "):
    merging.bind("nash")(base, [{"w": np.array([1.0, 0])}, {"w": np.array([-2.0, 0])}])


def test_nash_weights_refuses_a_zero_task_vector():
  with pytest.raises(ValueError, match="nonzero"):
    nash_weights(np.diag([1.0, 0.0]))
