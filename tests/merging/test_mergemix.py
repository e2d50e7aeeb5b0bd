"""MergeMix (moejax/merging/mergemix.py) against hand computations, brute force and
scipy: a one-hot mixture is that expert exactly, the simplex grid is every lattice
point of the simplex, the proxy at a vertex is that expert's score, Spearman is
scipy's, and the refusals (off the simplex, K weights for N models, shapes, K > N
domains) are one line naming the value."""

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from moejax.errors import ConfigError
from moejax.merging import mergemix


def tree(seed, shape=(3, 4)):
  rng = np.random.default_rng(seed)
  return {
    "layer": {"w": rng.normal(size=shape).astype(np.float32), "b": rng.normal(size=4)},
    "norm": rng.normal(size=(2,)).astype(np.float32),
  }


def flat(t):
  return np.concatenate([np.ravel(t["layer"]["b"]), np.ravel(t["layer"]["w"]), t["norm"]])


@pytest.mark.parametrize("j", [0, 1, 2])
def test_a_one_hot_mixture_returns_that_expert_exactly(j):
  base, experts = tree(0), [tree(s) for s in (1, 2, 3)]
  merged = mergemix.mixture_params(base, experts, np.eye(3)[j])
  np.testing.assert_array_equal(flat(merged), flat(experts[j]))
  assert merged["layer"]["w"].dtype == np.float32


def test_a_mixture_is_base_plus_weighted_task_vectors():
  base, experts = tree(0), [tree(s) for s in (1, 2, 3)]
  alpha = np.array([0.2, 0.3, 0.5])
  want = flat(base).astype(np.float64) + sum(
    a * (flat(e).astype(np.float64) - flat(base)) for a, e in zip(alpha, experts)
  )
  np.testing.assert_allclose(flat(mergemix.mixture_params(base, experts, alpha)), want, rtol=1e-6)


@pytest.mark.parametrize(
  "alpha, message",
  [
    ([0.6, 0.6, -0.2], r"^--weights=0.6,0.6,-0.2: weight -0.2 is negative"),
    ([0.5, 0.6, 0.0], r"^--weights=0.5,0.6,0: the weights sum to 1.1, not 1"),
    ([0.5, 0.5], r"^--weights=0.5,0.5 gives 2 weights for 3 models$"),
    ([0.25, 0.25, 0.25, 0.25], r"gives 4 weights for 3 models$"),
    ([np.nan, 0.5, 0.5], r"weight nan is not finite"),
  ],
)
def test_mixture_weights_off_the_simplex_or_of_another_count_are_refused(alpha, message):
  with pytest.raises(ConfigError, match=message):
    mergemix.mixture_params(tree(0), [tree(s) for s in (1, 2, 3)], alpha)


def test_experts_of_another_shape_name_the_first_differing_parameter():
  with pytest.raises(
    ConfigError,
    match=r"^models differ in shape at parameter layer/w: \(3, 4\) in base, "
    r"\(3, 5\) in models\[1\]$",
  ):
    mergemix.mixture_params(tree(0), [tree(1), tree(2, (3, 5))], [0.5, 0.5])


@pytest.mark.parametrize("k, resolution", [(1, 3), (2, 1), (3, 4), (4, 4), (5, 2)])
def test_the_simplex_grid_is_every_lattice_point_of_the_simplex(k, resolution):
  grid = mergemix.simplex_grid(k, resolution)
  brute = {
    counts
    for counts in itertools.product(range(resolution + 1), repeat=k)
    if sum(counts) == resolution
  }
  assert len(grid) == len(brute) == math.comb(resolution + k - 1, k - 1)
  assert {tuple(np.rint(row * resolution).astype(int)) for row in grid} == brute
  np.testing.assert_allclose(grid.sum(1), 1.0, atol=1e-12)
  assert grid.min() >= 0


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_the_grid_refuses_a_resolution_that_is_not_a_positive_integer(bad):
  with pytest.raises(ConfigError, match=f"^resolution={bad!r} must be an integer >= 1$"):
    mergemix.simplex_grid(3, bad)


def test_the_proxy_at_a_vertex_is_that_experts_score():
  base, experts = tree(0), [tree(s) for s in (1, 2, 3, 4)]

  def score(params):  # any deterministic function of the parameters
    return float(np.sum(np.square(flat(params).astype(np.float64))))

  grid = mergemix.simplex_grid(4, 2)
  scores = mergemix.proxy_scores(base, experts, grid, score)
  vertices = [int(np.flatnonzero(np.all(grid == e, axis=1))[0]) for e in np.eye(4)]
  assert [scores[v] for v in vertices] == [score(e) for e in experts]
  assert scores[vertices[2]] == score(experts[2])
  with pytest.raises(ConfigError, match=r"one weight per expert \(4\)"):
    mergemix.proxy_scores(base, experts, np.ones((2, 3)) / 3, score)


def test_spearman_is_scipys_and_the_hand_value():
  # d = (1, -1, 1, -1, 0): rho = 1 - 6 * 4 / (5 * 24) = 0.8
  assert mergemix.rank_agreement([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8, abs=1e-12)
  rng = np.random.default_rng(0)
  proxy, trained = rng.normal(size=12), rng.normal(size=12)
  trained[3] = trained[7]  # a tie: average ranks
  want = scipy.stats.spearmanr(proxy, trained).statistic
  assert mergemix.rank_agreement(proxy, trained) == pytest.approx(want, abs=1e-12)
  assert math.isnan(mergemix.rank_agreement([1, 2, 3], [5, 5, 5]))
  with pytest.raises(ConfigError, match="at least 3"):
    mergemix.rank_agreement([1, 2], [2, 1])


def test_the_best_mixture_is_the_lowest_score_ties_to_the_first():
  grid = mergemix.simplex_grid(3, 2)
  scores = np.arange(len(grid), dtype=float)[::-1].copy()
  scores[1] = scores[-1]
  np.testing.assert_array_equal(mergemix.best_mixture(grid, scores), grid[1])


def test_sampled_mixtures_start_uniform_and_lie_on_the_simplex():
  mixtures = mergemix.sample_mixtures(4, 12, seed=3)
  assert mixtures.shape == (12, 4)
  np.testing.assert_array_equal(mixtures[0], np.full(4, 0.25))
  np.testing.assert_allclose(mixtures.sum(1), 1.0, atol=1e-12)
  assert mixtures.min() >= 0
  np.testing.assert_array_equal(mixtures, mergemix.sample_mixtures(4, 12, seed=3))


@pytest.mark.parametrize(
  "domains, message",
  [
    (
      ["a", "b", "c", "d"],
      r"^domains=\['a', 'b', 'c', 'd'\] asks for K=4 experts, but the "
      r"corpus has only N=3 domains \(a, b, c\)$",
    ),
    (["a", "x"], r"^domains: 'x' is not a domain of the corpus; domains: a, b, c$"),
    (["a", "b", "a"], r"^domains=\['a', 'b', 'a'\] names 'a' twice$"),
    ([], r"^domains=\[\] must name at least one domain"),
  ],
)
def test_expert_domains_are_refused_beyond_the_corpus(domains, message):
  with pytest.raises(ConfigError, match=message):
    mergemix.check_domains(domains, ["a", "b", "c"])
  assert mergemix.check_domains(["c", "a"], ["a", "b", "c"]) == ["c", "a"]
