"""k-means by Lloyd's and by Hartigan's algorithm.

Lederman et al., "The Catastrophic Failure of the k-Means Algorithm in High
Dimensions, and How Hartigan's Algorithm Avoids It" (arXiv 2602.09936, ICML
2026). Only the abstract and introduction were read; anything said here about
the paper's body is marked "Guess".

Lloyd (1982): assign every point to its nearest centroid, recompute all
centroids, repeat. A point's own centroid contains the point, so with isotropic
noise sigma in d dimensions its own centroid is closer than the other one by
about sigma^2 d (1/n_a + 1/n_b) (n_a, n_b the cluster sizes). Once that bias
beats the signal, every partition is a fixed point and Lloyd returns its
initial partition (the paper's phenomenon).

Hartigan (1975), single-point moves: visit one point at a time and move x from
its cluster a to b iff
  Delta = n_b/(n_b+1) ||x - c_b||^2 - n_a/(n_a-1) ||x - c_a||^2 < 0,
which is exactly the change of the k-means objective; both centroids are
updated at once. The objective never increases and no cluster is emptied.
Guess: the paper's visiting order and stopping rule; here one random
permutation of the points (`visit_order`) is swept cyclically until a whole
sweep moves nothing, and each visit takes the best b.

Every function takes any [n, d] array of points (e.g. FFN neurons' weight rows,
to cluster neurons into experts for dense-to-MoE conversion).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError


class KMeansResult(NamedTuple):
  """Fields gain a leading [trials] axis from the *_trials functions."""

  labels: jax.Array  # [n] int32: each point's cluster
  centroids: jax.Array  # [k, d]: mean of each cluster (Lloyd: last centroid if emptied)
  objective: jax.Array  # []: sum_i ||x_i - c_{labels_i}||^2
  iterations: jax.Array  # []: Lloyd assignment steps, or Hartigan sweeps
  converged: jax.Array  # []: the last iteration changed nothing


def hartigan_delta(x, c_a, n_a, c_b, n_b):
  """Hartigan's criterion: the change of the k-means objective when x leaves a
  (n_a points, centroid c_a, x included) for b (n_b points, centroid c_b).

  Delta = n_b/(n_b+1) ||x - c_b||^2 - n_a/(n_a-1) ||x - c_a||^2; move iff < 0.
  Needs n_a >= 2. Plain arithmetic: numpy and JAX arrays keep their dtype and
  broadcast (c_b, n_b may hold every candidate b)."""
  d_a = ((x - c_a) ** 2).sum(-1)
  d_b = ((x - c_b) ** 2).sum(-1)
  return n_b / (n_b + 1) * d_b - n_a / (n_a - 1) * d_a


def visit_order(n: int, seed: int) -> np.ndarray:
  """The order in which `hartigan` visits the n points in every sweep."""
  return np.random.default_rng(seed).permutation(n).astype(np.int32)


def kmeans_objective(X, labels, k: int | None = None) -> float:
  """sum_i ||x_i - c_{labels_i}||^2 with c_j the mean of cluster j."""
  X, labels, k = _checked(X, labels, k, name="labels", nonempty=False)
  sums, counts = _sums_counts(X, labels, k)
  return float(_objective(X, labels, sums / jnp.maximum(counts, 1)[:, None]))


def lloyd(
  X, init_labels=None, *, init_centroids=None, k: int | None = None, max_iter: int = 100
) -> KMeansResult:
  """Lloyd's k-means from a partition (init_labels [n], every cluster non-empty)
  or from centroids (init_centroids [k, d]); give exactly one. Stops when an
  assignment step changes no label, or after max_iter of them. A cluster that
  empties keeps its last centroid."""
  _check_max_iter(max_iter)
  if (init_labels is None) == (init_centroids is None):
    raise ConfigError(
      "give exactly one of init_labels and init_centroids "
      f"(init_labels given={init_labels is not None}, "
      f"init_centroids given={init_centroids is not None})"
    )
  if init_labels is not None:
    X, labels, k = _checked(X, init_labels, k, name="init_labels", nonempty=True)
    sums, counts = _sums_counts(X, labels, k)
    return _lloyd(X, labels, sums / counts[:, None], k, max_iter)
  X = _points(X)
  c = jnp.asarray(init_centroids, X.dtype)
  if c.ndim != 2 or c.shape[1] != X.shape[1]:
    raise ConfigError(
      f"init_centroids must be [k, d={X.shape[1]}] (init_centroids.shape={tuple(c.shape)})"
    )
  _check_k(c.shape[0] if k is None else k, X.shape[0])
  if k is not None and k != c.shape[0]:
    raise ConfigError(f"k must equal init_centroids.shape[0]={c.shape[0]} (k={k})")
  no_labels = jnp.full((X.shape[0],), -1, jnp.int32)  # the first step always "changes"
  return _lloyd(X, no_labels, c, c.shape[0], max_iter)


def hartigan(
  X, init_labels, max_iter: int = 100, seed: int = 0, *, k: int | None = None
) -> KMeansResult:
  """Hartigan's single-point k-means from init_labels [n] (every cluster
  non-empty); sweeps `visit_order(n, seed)` until a sweep moves no point, or
  max_iter sweeps."""
  _check_max_iter(max_iter)
  X, labels, k = _checked(X, init_labels, k, name="init_labels", nonempty=True)
  return _hartigan(X, labels, jnp.asarray(visit_order(X.shape[0], seed)), k, max_iter)


def hartigan_step(X, labels, i: int, k: int | None = None):
  """One visit of point i: (new labels [n], Delta of the best move, +inf when i's
  cluster has one point or k = 1). The labels change iff Delta < 0."""
  X, labels, k = _checked(X, labels, k, name="labels", nonempty=True)
  if not 0 <= int(i) < X.shape[0]:
    raise ConfigError(f"point index must be in [0, n={X.shape[0]}) (i={i})")
  return _step(X, labels, i, k)


def lloyd_trials(X, init_labels, *, k: int | None = None, max_iter: int = 100) -> KMeansResult:
  """`lloyd` from init_labels, vmapped over trials: X [T, n, d], init_labels [T, n]."""
  _check_max_iter(max_iter)
  X, labels, k = _checked_trials(X, init_labels, k)
  sums, counts = jax.vmap(_sums_counts, (0, 0, None))(X, labels, k)
  return jax.vmap(_lloyd, (0, 0, 0, None, None))(X, labels, sums / counts[..., None], k, max_iter)


def hartigan_trials(
  X, init_labels, seeds, *, k: int | None = None, max_iter: int = 100
) -> KMeansResult:
  """`hartigan` vmapped over trials: X [T, n, d], init_labels [T, n], seeds [T]."""
  _check_max_iter(max_iter)
  X, labels, k = _checked_trials(X, init_labels, k)
  if len(seeds) != X.shape[0]:
    raise ConfigError(f"need one seed per trial, {X.shape[0]} (len(seeds)={len(seeds)})")
  orders = jnp.asarray(np.stack([visit_order(X.shape[1], int(s)) for s in seeds]))
  return jax.vmap(_hartigan, (0, 0, 0, None, None))(X, labels, orders, k, max_iter)


# ---- input checks (host side, before anything is compiled) ------------------------------


def _points(X) -> jax.Array:
  X = np.asarray(X)
  if X.ndim != 2 or 0 in X.shape:
    raise ConfigError(f"points must be a non-empty [n, d] array (X.shape={X.shape})")
  return jnp.asarray(X, jnp.result_type(float))


def _check_k(k: int, n: int) -> None:
  if not 1 <= k <= n:
    raise ConfigError(f"the number of clusters must be in [1, n={n}] (k={k})")


def _check_max_iter(max_iter: int) -> None:
  if int(max_iter) != max_iter or max_iter < 1:
    raise ConfigError(f"max_iter must be an integer >= 1 (max_iter={max_iter})")


def _check_labels(labels: np.ndarray, n: int, k: int | None, name: str, nonempty: bool) -> int:
  """k (given, or 1 + the largest label); refuses bad shapes, values and empty clusters."""
  if labels.shape[-1:] != (n,):
    raise ConfigError(f"{name} must have one label per point, n={n} ({name}.shape={labels.shape})")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ConfigError(f"{name} must be integers ({name}.dtype={labels.dtype})")
  k = int(labels.max()) + 1 if k is None else k
  _check_k(k, n)
  if labels.min() < 0 or labels.max() >= k:
    raise ConfigError(
      f"{name} must lie in [0, k={k}) ({name} range=[{labels.min()}, {labels.max()}])"
    )
  if nonempty:
    counts = np.stack([np.bincount(row, minlength=k) for row in labels.reshape(-1, n)])
    if counts.min() == 0:
      raise ConfigError(
        f"{name} leave a cluster empty (empty cluster={int(np.argwhere(counts == 0)[0, 1])})"
      )
  return k


def _checked(X, labels, k, *, name: str, nonempty: bool):
  X = _points(X)
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ConfigError(f"{name} must be an [n] array ({name}.shape={labels.shape})")
  k = _check_labels(labels, X.shape[0], k, name, nonempty)
  return X, jnp.asarray(labels, jnp.int32), k


def _checked_trials(X, labels, k):
  X, labels = np.asarray(X), np.asarray(labels)
  if X.ndim != 3 or 0 in X.shape:
    raise ConfigError(f"points must be a non-empty [trials, n, d] array (X.shape={X.shape})")
  if labels.shape[:1] != X.shape[:1] or labels.ndim != 2:
    raise ConfigError(
      f"init_labels must be [trials={X.shape[0]}, n={X.shape[1]}] "
      f"(init_labels.shape={labels.shape})"
    )
  k = _check_labels(labels, X.shape[1], k, "init_labels", nonempty=True)
  return jnp.asarray(X, jnp.result_type(float)), jnp.asarray(labels, jnp.int32), k


# ---- compiled cores ---------------------------------------------------------------------


def _sums_counts(X, labels, k):
  sums = jax.ops.segment_sum(X, labels, num_segments=k)
  counts = jax.ops.segment_sum(jnp.ones(labels.shape, X.dtype), labels, num_segments=k)
  return sums, counts


def _objective(X, labels, centroids):
  return jnp.sum((X - centroids[labels]) ** 2)


@functools.partial(jax.jit, static_argnames=("k",))
def _lloyd(X, labels, centroids, k, max_iter):
  def body(state):
    labels, c, it, _ = state
    # argmin_j ||x - c_j||^2 = argmin_j ||c_j||^2 - 2 <x, c_j>: no [n, k, d] tensor
    new = jnp.argmin(jnp.sum(c * c, -1) - 2 * X @ c.T, -1).astype(jnp.int32)
    sums, counts = _sums_counts(X, new, k)
    c = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1)[:, None], c)
    return new, c, it + 1, jnp.any(new != labels)

  state = (labels, centroids, jnp.int32(0), jnp.bool_(True))
  labels, c, it, changed = jax.lax.while_loop(lambda s: s[3] & (s[2] < max_iter), body, state)
  return KMeansResult(labels, c, _objective(X, labels, c), it, ~changed)


def _best_move(x, a, sums, counts):
  """(b, Delta) of point x's best single move out of cluster a; Delta = +inf if none."""
  n_a = counts[a]
  deltas = hartigan_delta(x, sums[a] / n_a, jnp.maximum(n_a, 2), sums / counts[:, None], counts)
  allowed = (jnp.arange(counts.shape[0]) != a) & (n_a >= 2)  # never empty a cluster
  deltas = jnp.where(allowed, deltas, jnp.inf)
  b = jnp.argmin(deltas).astype(jnp.int32)
  return b, deltas[b]


@functools.partial(jax.jit, static_argnames=("k",))
def _step(X, labels, i, k):
  sums, counts = _sums_counts(X, labels, k)
  b, delta = _best_move(X[i], labels[i], sums, counts)
  return jnp.where(delta < 0, labels.at[i].set(b), labels), delta


@functools.partial(jax.jit, static_argnames=("k",))
def _hartigan(X, labels, order, k, max_iter):
  def visit(t, state):
    labels, sums, counts, moves = state
    i = order[t]
    a = labels[i]
    b, delta = _best_move(X[i], a, sums, counts)
    move = delta < 0
    step = jnp.where(move, 1.0, 0.0)
    sums = sums.at[a].add(-step * X[i]).at[b].add(step * X[i])
    counts = counts.at[a].add(-step).at[b].add(step)
    return jnp.where(move, labels.at[i].set(b), labels), sums, counts, moves + move

  def sweep(state):
    labels, it, _ = state
    sums, counts = _sums_counts(X, labels, k)  # fresh sums each sweep: no drift
    labels, _, _, moves = jax.lax.fori_loop(
      0, X.shape[0], visit, (labels, sums, counts, jnp.int32(0))
    )
    return labels, it + 1, moves > 0

  state = (labels, jnp.int32(0), jnp.bool_(True))
  labels, it, moved = jax.lax.while_loop(lambda s: s[2] & (s[1] < max_iter), sweep, state)
  sums, counts = _sums_counts(X, labels, k)
  c = sums / counts[:, None]
  return KMeansResult(labels, c, _objective(X, labels, c), it, ~moved)
