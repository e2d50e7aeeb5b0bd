"""Merge methods (moejax/merging/) against hand computations and numpy: task
arithmetic with one-hot weights is that model, TIES on hand-made sign conflicts,
averaging is numpy's mean, and the refusals (shapes, simplex, settings)."""

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.merging import MERGE_METHODS, bind
from moejax.merging.ties import trim_threshold


def tree(seed, shapes=None):
  rng = np.random.default_rng(seed)
  shapes = shapes or {"w": (3, 4), "b": (4,)}
  return {
    "layer": {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()},
    "scale": rng.normal(size=(2,)).astype(np.float32),
  }


def equal(a, b):
  assert a.keys() == b.keys()
  for k in a:
    if isinstance(a[k], dict):
      equal(a[k], b[k])
    else:
      assert a[k].dtype == b[k].dtype
      np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("j", [0, 1, 2])
def test_task_arithmetic_with_one_hot_weights_returns_that_model_exactly(j):
  base, models = tree(0), [tree(s) for s in (1, 2, 3)]
  merged = bind("task_arithmetic")(base, models, np.eye(3)[j])
  equal(merged, models[j])


def test_task_arithmetic_is_base_plus_scaled_weighted_task_vectors():
  base, models = tree(0), [tree(1), tree(2)]
  merged = bind("task_arithmetic", {"scale": 0.5})(base, models, [2.0, -1.0])

  def w(t):
    return t["layer"]["w"].astype(np.float64)

  want = w(base) + 0.5 * (2 * (w(models[0]) - w(base)) - (w(models[1]) - w(base)))
  np.testing.assert_allclose(merged["layer"]["w"], want, rtol=1e-6)


def test_ties_on_hand_made_sign_conflicts():
  """Three task vectors over six entries, base 1; density 0.5 keeps each vector's
  three largest magnitudes (thresholds 3, 2 and 2.5; the third vector's two entries
  at 2.5 are both kept). Per entry: tau -> trimmed -> elected sign -> disjoint mean:
    e0: (+3, -1, 0)      -> (+3, 0, 0)       -> +  -> 3
    e1: (-2, +1, +2.5)   -> (-2, 0, +2.5)    -> +  -> 2.5   (the larger mass wins)
    e2: (+1, +4, -5)     -> (0, +4, -5)      -> -  -> -5
    e3: (.1, .2, .3)     -> (0, 0, 0)        -> 0  -> 0
    e4: (-4, -3, +2.5)   -> (-4, -3, +2.5)   -> -  -> mean(-4, -3) = -3.5
    e5: (+.5, +2, +3)    -> (0, +2, +3)      -> +  -> mean(2, 3) = 2.5"""
  base = {"v": np.ones(6, np.float32)}
  taus = np.array(
    [[3, -2, 1, 0.1, -4, 0.5], [-1, 1, 4, 0.2, -3, 2], [0, 2.5, -5, 0.3, 2.5, 3]], np.float32
  )
  models = [{"v": base["v"] + t} for t in taus]
  merged = bind("ties", {"density": 0.5})(base, models)
  np.testing.assert_allclose(merged["v"], 1 + np.array([3, 2.5, -5, 0, -3.5, 2.5]), atol=1e-6)


def test_ties_trims_over_the_whole_task_vector():
  """The threshold is the k-th largest |tau| over every leaf, k = ceil(density n)."""
  assert trim_threshold([np.array([5.0, -1.0]), np.array([[0.5, -3.0]])], 0.5) == 3.0
  assert trim_threshold([np.array([5.0, -1.0, 0.5])], 0.1) == 5.0  # k = 1
  assert trim_threshold([np.array([5.0, -1.0, 0.5])], 1.0) == 0.5


def test_ties_at_density_one_without_conflicts_is_the_mean_of_task_vectors():
  base = {"v": np.zeros(4, np.float32)}
  models = [{"v": np.array([1, 2, 0, -1], np.float32)}, {"v": np.array([3, 4, 0, -3], np.float32)}]
  merged = bind("ties", {"density": 1.0, "scale": 2.0})(base, models)
  np.testing.assert_allclose(merged["v"], 2 * np.array([2, 3, 0, -2]), atol=1e-6)


def test_average_is_numpys_mean_and_weighted_mean():
  models = [tree(s) for s in range(4)]
  merged = bind("average")(None, models)
  stack = np.stack([m["layer"]["w"] for m in models]).astype(np.float64)
  np.testing.assert_allclose(merged["layer"]["w"], np.mean(stack, axis=0), rtol=1e-6)
  w = np.array([0.1, 0.2, 0.3, 0.4])
  merged = bind("average")(None, models, w)
  np.testing.assert_allclose(merged["layer"]["w"], np.average(stack, axis=0, weights=w), rtol=1e-6)
  assert merged["layer"]["w"].dtype == np.float32


def test_merging_models_of_different_shapes_names_the_first_differing_parameter():
  base, other = tree(0), tree(1, {"w": (3, 5), "b": (4,)})
  with pytest.raises(
    ConfigError,
    match=r"^models differ in shape at parameter layer/w: "
    r"\(3, 4\) in --base=A, \(3, 5\) in --experts\[1\]=C$",
  ):
    bind("task_arithmetic")(
      base, [tree(2), other], names=["--base=A", "--experts[0]=B", "--experts[1]=C"]
    )
  missing = tree(1, {"w": (3, 4)})
  with pytest.raises(ConfigError, match=r"parameter layer/b is in base but not in models\[0\]"):
    bind("average")(base, [missing])


@pytest.mark.parametrize("method", ["average", "ties"])
@pytest.mark.parametrize(
  "weights, message",
  [
    ([0.5, 0.7, -0.2], r"--weights=0.5,0.7,-0.2: weight -0.2 is negative"),
    ([0.5, 0.6, 0.0], r"--weights=0.5,0.6,0: the weights sum to 1.1, not 1"),
    ([0.2, 0.2, 0.2], r"the weights sum to 0.6, not 1"),
  ],
)
def test_weights_off_the_simplex_are_refused_where_required(method, weights, message):
  models = [tree(s) for s in (1, 2, 3)]
  with pytest.raises(ConfigError, match=message):
    bind(method)(tree(0), models, weights)


def test_simplex_tolerance_and_task_arithmetic_negation():
  models = [tree(s) for s in (1, 2)]
  bind("average")(None, models, [0.5 + 5e-7, 0.5])  # within 1e-6
  with pytest.raises(ConfigError, match="sum to 1.000002"):
    bind("average")(None, models, [0.5 + 2e-6, 0.5])
  bind("task_arithmetic")(tree(0), models, [1.0, -1.0])  # negation: no simplex
  with pytest.raises(
    ConfigError,
    match=r"--weights=1: gives 1 weights for 2 models|gives 1 "
    "weights for 2 models",
  ):
    bind("task_arithmetic")(tree(0), models, [1.0])
  with pytest.raises(ConfigError, match="weight nan is not finite"):
    bind("task_arithmetic")(tree(0), models, [np.nan, 1.0])


@pytest.mark.parametrize(
  "name, settings, message",
  [
    ("ties", {"density": 0.0}, r"--density=0.0 must be a finite number > 0.0 and <= 1.0"),
    ("ties", {"density": 1.5}, r"--density=1.5"),
    ("task_arithmetic", {"scale": float("nan")}, r"--scale=nan"),
    ("task_arithmetic", {"scale": -1.0}, r"--scale=-1.0 must be a finite number > 0.0"),
    ("average", {"scale": 2.0}, r"--scale=2.0 is not a setting of --method=average"),
    (
      "nope",
      {},
      r"--method='nope' is not known; valid: average, mergemix, nash, task_arithmetic, ties",
    ),
  ],
)
def test_bad_settings_are_refused_once_at_bind(name, settings, message):
  with pytest.raises(ConfigError, match=message):
    bind(name, settings)


def test_a_method_that_reads_a_base_refuses_none():
  with pytest.raises(ConfigError, match="--method=ties needs a base model"):
    bind("ties")(None, [tree(1)])
  assert {n for n, m in MERGE_METHODS.items() if not m.needs_base} == {"average"}
