"""Neuron partitions of a dense FFN (moejax/conversion/partition.py) and the
confidence-weighted routing supervision (moejax/conversion/supervision.py)."""

import jax
import numpy as np
import pytest

from moejax.conversion import partition, supervision, trajectory
from moejax.errors import ConfigError
from moejax.mixtures import kmeans


def dense_ffn(seed=0, d=12, width=48):
  rng = np.random.default_rng(seed)
  return (
    rng.normal(size=(d, width)),
    rng.normal(size=(d, width)),
    rng.normal(size=(width, d)),
    rng.normal(size=(64, d)),
  )


def swiglu(x, w_gate, w_up, w_down):
  g = x @ w_gate
  return (g / (1 + np.exp(-g)) * (x @ w_up)) @ w_down


@pytest.mark.parametrize("kind", ["random", "kmeans_lloyd", "kmeans_hartigan", "trajectory"])
def test_all_experts_with_unit_gates_sum_to_the_dense_ffn(kind):
  w_gate, w_up, w_down, x = dense_ffn()
  if kind == "random":
    labels = partition.random_partition(48, 8, seed=3)
  elif kind == "trajectory":
    labels = trajectory.fit_layer(x, w_gate, w_up, w_down, 8, 3, seed=0)[0]
  else:
    labels, _ = partition.balanced_kmeans(
      partition.neuron_keys(w_gate), 8, kind.removeprefix("kmeans_")
    )
  experts = partition.split_ffn(w_gate, w_up, w_down, labels, 8)
  assert experts["w_gate"].shape == (8, 12, 6) and experts["w_down"].shape == (8, 6, 12)
  total = sum(
    swiglu(x, experts["w_gate"][e], experts["w_up"][e], experts["w_down"][e]) for e in range(8)
  )
  dense = swiglu(x, w_gate, w_up, w_down)
  np.testing.assert_allclose(total, dense, rtol=0, atol=1e-5 * np.abs(dense).max())
  # one expert alone is not the dense FFN (the check can fail)
  one = swiglu(x, experts["w_gate"][0], experts["w_up"][0], experts["w_down"][0])
  assert np.abs(one - dense).max() > 1e-2


@pytest.mark.parametrize("algorithm", ["lloyd", "hartigan"])
def test_balanced_kmeans_equal_groups_and_a_non_increasing_objective(algorithm):
  rng = np.random.default_rng(1)
  centres = rng.normal(size=(4, 6)) * 3
  X = centres[rng.integers(0, 4, 40)] + rng.normal(size=(40, 6))  # unequal true clusters
  labels, trace = partition.balanced_kmeans(X, 4, algorithm, seed=2)
  assert np.bincount(labels, minlength=4).tolist() == [10] * 4
  assert all(b <= a + 1e-9 for a, b in zip(trace, trace[1:]))
  assert trace[-1] < partition.objective(X, partition.random_partition(40, 4, 2), 4)
  # the shared unconstrained algorithms never increase the objective either
  init = partition.random_partition(40, 4, 2)
  start = kmeans.kmeans_objective(X, init, 4)
  run = (
    kmeans.lloyd(X, init, k=4) if algorithm == "lloyd" else kmeans.hartigan(X, init, seed=2, k=4)
  )
  assert float(run.objective) <= start + 1e-4


def test_hartigan_swaps_change_the_objective_by_the_stated_amount():
  rng = np.random.default_rng(5)
  X, labels = rng.normal(size=(12, 3)), np.repeat(np.arange(3), 4)
  c = partition._centroids(X, labels, 3)
  i, j = 0, 5  # groups 0 and 1
  d = X[j] - X[i]
  predicted = 2 * (c[1] - c[0]) @ d - 2 * d @ d / 4
  swapped = labels.copy()
  swapped[i], swapped[j] = 1, 0
  np.testing.assert_allclose(
    partition.objective(X, swapped, 3) - partition.objective(X, labels, 3), predicted, rtol=1e-10
  )


def test_split_refuses_unequal_groups_and_widths_e_does_not_divide():
  with pytest.raises(ConfigError, match=r"5 experts must divide the dense FFN width d_ff=48"):
    partition.random_partition(48, 5, 0)
  w_gate, w_up, w_down, _ = dense_ffn()
  with pytest.raises(ConfigError, match=r"must all hold 6 neurons"):
    partition.split_ffn(w_gate, w_up, w_down, np.repeat(np.arange(8), 6)[::-1] * 0, 8)


def test_confidence_weight_is_one_minus_max_next_token_probability():
  # logits log(0.7), log(0.2), log(0.1): max probability 0.7, weight 0.3;
  # uniform over 4: weight 0.75
  logits = np.log(np.array([[0.7, 0.2, 0.1, 1e-30], [0.25, 0.25, 0.25, 0.25]]))
  np.testing.assert_allclose(supervision.confidence_weight(logits), [0.3, 0.75], atol=1e-6)


def test_routing_supervision_is_the_weighted_kl_by_hand():
  logits = np.log(np.array([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]))
  target = np.array([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
  weight = np.array([0.3, 0.9])
  # token 0: KL = 1 * log(1 / 0.5) = log 2; token 1: target = router, KL = 0
  expected = (0.3 * np.log(2) + 0.9 * 0) / 2
  np.testing.assert_allclose(
    supervision.routing_supervision(logits, target, weight), expected, rtol=1e-6
  )
  grad = jax.grad(lambda z: supervision.routing_supervision(z, target, weight))(logits)
  assert np.abs(np.asarray(grad)[1]).max() < 1e-6 and np.abs(np.asarray(grad)[0]).max() > 0.01
