"""Lloyd vs Hartigan k-means (arXiv 2602.09936): Hartigan's criterion against the
brute-force objective change of every single-point move, its runs replayed by a
float64 brute force, its objective never increasing; both algorithms recover
separated clusters at d=2; Lloyd returns its initial partition at n=40,
d=2000 while Hartigan recovers the clusters; NMI by hand; refusals."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moejax.errors import ConfigError
from moejax.evaluation.partitions import nmi
from moejax.mixtures import kmeans as km
from moejax.mixtures import synthetic


def objective64(X, labels, k):
  """Brute force in float64: sum over clusters of squared distances to the mean."""
  X = np.asarray(X, np.float64)
  return sum(
    ((X[labels == j] - X[labels == j].mean(0)) ** 2).sum() for j in range(k) if np.any(labels == j)
  )


def single_moves(X, labels, i, k):
  """{b: objective change} of every move of point i that leaves no cluster empty."""
  a = labels[i]
  if np.sum(labels == a) < 2:
    return {}
  base = objective64(X, labels, k)
  out = {}
  for b in range(k):
    if b != a:
      moved = labels.copy()
      moved[i] = b
      out[b] = objective64(X, moved, k) - base
  return out


def blobs(rng, n, d, k, separation):
  """n points, k equal Gaussian clusters (unit noise) with means `separation` apart."""
  truth = np.arange(n) % k
  means = np.zeros((k, d))
  means[np.arange(k), np.arange(k) % d] = separation / np.sqrt(2)
  if k == 2:  # along a random direction, at distance exactly `separation`
    u = rng.standard_normal(d)
    means = np.stack([u, -u]) * separation / (2 * np.linalg.norm(u))
  return rng.standard_normal((n, d)) + means[truth], truth


def random_labels(rng, n, k):
  """Uniform labels with every cluster used."""
  while True:
    labels = rng.integers(0, k, n)
    if len(np.unique(labels)) == k:
      return labels


# (n, d, k) from a short list (each new shape compiles), then a seed
shapes = st.tuples(
  st.sampled_from([(7, 1, 1), (7, 5, 3), (12, 50, 4), (20, 1, 3), (20, 2, 2), (20, 200, 5)]),
  st.integers(0, 2**31 - 1),
).map(lambda s: (*s[0], s[1]))


@settings(max_examples=60)
@given(st.integers(3, 12), st.integers(1, 6), st.integers(2, 4), st.integers(0, 2**31 - 1))
def test_criterion_is_the_exact_objective_change(n, d, k, seed):
  rng = np.random.default_rng(seed)
  X = rng.standard_normal((n, d)) * rng.uniform(0.1, 10)
  labels = random_labels(rng, n, min(k, n))
  for i in range(n):
    for b, change in single_moves(X, labels, i, k).items():
      a = labels[i]
      n_a, n_b = np.sum(labels == a), np.sum(labels == b)
      delta = km.hartigan_delta(X[i], X[labels == a].mean(0), n_a, X[labels == b].mean(0), n_b)
      np.testing.assert_allclose(delta, change, rtol=1e-9, atol=1e-9 * np.sum(X**2))


@settings(max_examples=30)
@given(shapes)
def test_a_step_moves_iff_the_brute_force_best_move_lowers_the_objective(shape):
  n, d, k, seed = shape
  rng = np.random.default_rng(seed)
  X = rng.standard_normal((n, d))
  labels = random_labels(rng, n, k)
  scale = 1e-4 * d
  for i in range(n):
    moves = single_moves(X, labels, i, k)
    new, delta = km.hartigan_step(X, labels, i, k=k)
    new = np.asarray(new)
    if not moves:  # i is alone in its cluster, or k = 1: never moved
      assert np.isinf(delta) and np.array_equal(new, labels)
      continue
    best = min(moves, key=moves.get)
    np.testing.assert_allclose(float(delta), moves[best], atol=scale)
    if abs(moves[best]) < scale:
      continue  # a near-tie: float32 may go either way
    expect = labels.copy()
    if moves[best] < 0:
      expect[i] = best
    assert np.array_equal(new, expect), (i, moves)


def replay64(X, labels, k, order, max_sweeps=100):
  """Hartigan in float64 by brute force: at each visit take the move that lowers
  the recomputed objective most, if any; stop after a sweep with no move."""
  labels = labels.copy()
  for sweep in range(1, max_sweeps + 1):
    moved = 0
    for i in order:
      moves = single_moves(X, labels, i, k)
      if moves and min(moves.values()) < 0:
        labels[i] = min(moves, key=moves.get)
        moved += 1
    if not moved:
      return labels, sweep
  return labels, max_sweeps


@pytest.mark.parametrize("seed", range(6))
def test_a_run_equals_the_brute_force_replay_of_every_visit(seed):
  rng = np.random.default_rng(seed)
  X, _ = blobs(rng, 14, 3, 3, separation=2.0)
  init = random_labels(rng, 14, 3)
  expect, sweeps = replay64(X, init, 3, km.visit_order(14, seed))
  got = km.hartigan(X, init, max_iter=100, seed=seed)
  assert not np.array_equal(expect, init)  # the run did move points
  assert np.array_equal(np.asarray(got.labels), expect)
  assert int(got.iterations) == sweeps and bool(got.converged)
  np.testing.assert_allclose(float(got.objective), objective64(X, expect, 3), rtol=1e-5)


@settings(max_examples=30)
@given(shapes, st.floats(0.0, 6.0))
def test_hartigan_objective_never_increases(shape, separation):
  n, d, k, seed = shape
  rng = np.random.default_rng(seed)
  X, _ = blobs(rng, n, d, k, separation)
  init = random_labels(rng, n, k)
  tol = 1e-5 * np.sum(X**2)
  labels, previous = init.copy(), objective64(X, init, k)
  for i in km.visit_order(n, seed):  # the first sweep, move by move
    labels, _ = km.hartigan_step(X, labels, i, k=k)
    labels = np.asarray(labels)
    now = objective64(X, labels, k)
    assert now <= previous + tol
    previous = now
  np.testing.assert_array_equal(labels, km.hartigan(X, init, 1, seed, k=k).labels)
  previous = objective64(X, init, k)
  for sweeps in range(1, 6):  # then sweep by sweep
    result = km.hartigan(X, init, max_iter=sweeps, seed=seed, k=k)
    labels = np.asarray(result.labels)
    assert np.all(np.bincount(labels, minlength=k) >= 1)  # no cluster emptied
    now = objective64(X, labels, k)
    assert now <= previous + tol
    previous = now
  if bool(result.converged):  # a Hartigan local optimum: no single move helps
    assert all(c >= -tol for i in range(n) for c in single_moves(X, labels, i, k).values())


def lloyd64(X, labels, k, max_iter=100):
  """Lloyd in float64: labels from the nearest centroid until they stop changing."""
  centroids = np.stack([X[labels == j].mean(0) for j in range(k)])
  for _ in range(max_iter):
    new = np.argmin(((X[:, None] - centroids[None]) ** 2).sum(-1), 1)
    for j in range(k):
      if np.any(new == j):
        centroids[j] = X[new == j].mean(0)
    if np.array_equal(new, labels):
      break
    labels = new
  return labels


@pytest.mark.parametrize("seed", range(4))
def test_lloyd_matches_a_float64_reference(seed):
  rng = np.random.default_rng(seed)
  X, _ = blobs(rng, 30, 4, 3, separation=3.0)
  init = random_labels(rng, 30, 3)
  np.testing.assert_array_equal(km.lloyd(X, init).labels, lloyd64(X, init, 3))


@pytest.mark.parametrize("seed", range(5))
def test_both_recover_separated_clusters_at_d2(seed):
  rng = np.random.default_rng(seed)
  X, truth = blobs(rng, 40, 2, 2, separation=20.0)
  init = random_labels(rng, 40, 2)
  assert nmi(truth, km.lloyd(X, init).labels) == pytest.approx(1.0)
  assert nmi(truth, km.hartigan(X, init, seed=seed).labels) == pytest.approx(1.0)
  means = np.stack([X[truth == 0].mean(0), X[truth == 1].mean(0)]) + 1.0
  assert nmi(truth, km.lloyd(X, init_centroids=means).labels) == pytest.approx(1.0)


def two_cluster_trials(d, trials=20, separation=10.0, n=40):
  rng = np.random.default_rng(d)
  pairs = [blobs(rng, n, d, 2, separation) for _ in range(trials)]
  X, truth = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
  init = np.stack([random_labels(rng, n, 2) for _ in range(trials)])
  return X, truth, init


def test_lloyd_returns_its_initial_partition_in_high_d_and_hartigan_does_not():
  X, truth, init = two_cluster_trials(d=2000)
  lloyd = km.lloyd_trials(X, init)
  hartigan = km.hartigan_trials(X, init, seeds=range(len(X)))
  stuck = np.all(np.asarray(lloyd.labels) == init, axis=1)
  assert stuck.mean() >= 0.9  # the paper: essentially every partition is a fixed point
  assert np.all(np.asarray(lloyd.iterations)[stuck] == 1)
  assert np.mean([nmi(t, h) for t, h in zip(truth, hartigan.labels)]) >= 0.8
  assert not np.any(np.all(np.asarray(hartigan.labels) == init, axis=1))
  X, truth, init = two_cluster_trials(d=2)  # the same separation is easy at d=2
  lloyd = km.lloyd_trials(X, init)
  assert not np.any(np.all(np.asarray(lloyd.labels) == init, axis=1))
  assert np.mean([nmi(t, found) for t, found in zip(truth, lloyd.labels)]) == pytest.approx(1.0)


def test_trials_equal_single_runs():
  X, _, init = two_cluster_trials(d=50, trials=4)
  batch = km.hartigan_trials(X, init, seeds=[3, 4, 5, 6])
  lloyd = km.lloyd_trials(X, init)
  for t in range(4):
    np.testing.assert_array_equal(batch.labels[t], km.hartigan(X[t], init[t], seed=3 + t).labels)
    np.testing.assert_array_equal(lloyd.labels[t], km.lloyd(X[t], init[t]).labels)


@pytest.mark.parametrize("d, separation", [(1, 3.0), (3, 10.0), (50, 0.0)])
def test_two_clusters_puts_the_means_separation_apart(d, separation):
  X, truth, init = synthetic.two_clusters(np.random.default_rng(d), 20000, d, separation)
  assert X.dtype == np.float32 and X.shape == (20000, d)
  assert truth.sum() == 10000 and np.all(truth[:10000] == 0)
  assert set(init.tolist()) == {0, 1} and abs(init.mean() - 0.5) < 0.02
  X = X.astype(np.float64)
  gap = X[truth == 1].mean(0) - X[truth == 0].mean(0)  # noise: std sqrt(2 d / 10000) in norm
  assert abs(np.linalg.norm(gap) - separation) < 5 * np.sqrt(2 * d / 10000)
  residual = np.concatenate([X[truth == c] - X[truth == c].mean(0) for c in (0, 1)])
  np.testing.assert_allclose(residual.std(0), 1.0, atol=0.05)
  with pytest.raises(ConfigError, match="n=1"):
    synthetic.two_clusters(np.random.default_rng(0), 1, d, separation)


X6 = np.zeros((6, 2))
REFUSALS = [
  (lambda: km.hartigan(X6, np.zeros(6, int), k=0), "(k=0)"),
  (lambda: km.hartigan(X6, np.arange(6), k=7), "(k=7)"),
  (lambda: km.lloyd(X6, init_centroids=np.zeros((7, 2))), "(k=7)"),
  (lambda: km.lloyd(X6, init_centroids=np.zeros((2, 3))), "init_centroids.shape=(2, 3)"),
  (lambda: km.lloyd(X6), "init_labels given=False"),
  (lambda: km.lloyd(X6, np.zeros(6, int), init_centroids=np.zeros((1, 2))), "given=True"),
  (lambda: km.hartigan(np.zeros(6), np.zeros(6, int)), "X.shape=(6,)"),
  (lambda: km.hartigan(X6, np.zeros(5, int)), "init_labels.shape=(5,)"),
  (lambda: km.hartigan(X6, np.zeros(6)), "init_labels.dtype=float64"),
  (lambda: km.hartigan(X6, np.array([0, 1, 2, 0, 1, -1])), "range=[-1, 2]"),
  (lambda: km.hartigan(X6, np.array([0, 2, 2, 0, 2, 0])), "empty cluster=1"),
  (lambda: km.lloyd(X6, np.array([0, 0, 0, 0, 0, 0]), k=2), "empty cluster=1"),
  (lambda: km.hartigan(X6, np.zeros(6, int), max_iter=0), "max_iter=0"),
  (lambda: km.hartigan_step(X6, np.array([0, 1] * 3), 6), "(i=6)"),
  (lambda: km.lloyd_trials(np.zeros((2, 6, 2)), np.zeros((3, 6), int)), "(3, 6)"),
  (lambda: km.hartigan_trials(np.zeros((2, 6, 2)), np.zeros((2, 6), int), [0]), "=1)"),
]


@pytest.mark.parametrize("call,value", REFUSALS)
def test_refusals_name_the_value_in_one_line(call, value):
  with pytest.raises(ConfigError) as error:
    call()
  assert value in str(error.value) and "\n" not in str(error.value)


def one_far_point():
  """5 points in 3-d: four around (0.5, 0.5, 0), one far at (10, 0, 2)."""
  return np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0], [10, 0, 2]], np.float32)


def test_lloyd_moves_a_one_point_clusters_centroid_onto_its_point():
  """Started from centroids that are no data point, the far point is a cluster of
  its own after the first assignment: its centroid is the point itself (and the
  objective the four others' spread, 4 * 0.5), not the initial centroid."""
  X = one_far_point()
  result = km.lloyd(X, init_centroids=np.array([[0.2, 0.2, 1.0], [8.0, 1.0, 1.0]]))
  np.testing.assert_array_equal(result.labels, [0, 0, 0, 0, 1])
  np.testing.assert_allclose(result.centroids, [[0.5, 0.5, 0.0], [10.0, 0.0, 2.0]], atol=1e-6)
  assert float(result.objective) == pytest.approx(2.0)
  assert bool(result.converged) and int(result.iterations) == 2


def test_hartigan_keeps_a_one_point_cluster_and_returns_its_point_as_centroid():
  """A one-point cluster cannot move its point (n_a >= 2); the result's centroids
  are the cluster means, the far point's its own coordinates."""
  X = one_far_point()
  result = km.hartigan(X, np.array([0, 0, 0, 0, 1]), seed=0)
  np.testing.assert_array_equal(result.labels, [0, 0, 0, 0, 1])
  np.testing.assert_allclose(result.centroids, [[0.5, 0.5, 0.0], [10.0, 0.0, 2.0]], atol=1e-6)
  assert float(result.objective) == pytest.approx(2.0)
