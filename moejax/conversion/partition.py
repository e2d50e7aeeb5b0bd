"""Partitions of a dense SwiGLU FFN's hidden neurons into E equal groups.

A dense FFN y = W_down^T (silu(W_gate^T x) * (W_up^T x)) is a sum over its F hidden
neurons, so any partition of the neurons into groups gives experts
FFN_e(x) = W_down[S_e]^T (silu(W_gate[:, S_e]^T x) * (W_up[:, S_e]^T x)) with
sum_e FFN_e(x) = FFN(x) exactly (unit gates): Prism-MoE's starting point (ICML 2026;
abstract only read) and MoEfication's (Zhang et al. 2022, arXiv 2110.01786, sec. 3.1).

Partitions (labels [F] in [0, E), every group F / E neurons):
  random          a seeded permutation cut into E blocks;
  kmeans_lloyd    balanced k-means of the neurons' keys (MoEfication's
  kmeans_hartigan   "parameter clustering split"); the clustering is the shared code
                  of moejax/mixtures/kmeans.py (Lloyd's or Hartigan's algorithm).
Balance is enforced after the shared clustering, in two steps (our construction;
MoEfication's balanced k-means is not specified beyond equal sizes):
  1. the optimal equal-size assignment of the points to the clustering's centroids
     (each centroid offered F/E slots; scipy's linear_sum_assignment on squared
     distances), then
  2. a balanced refinement that never increases the objective: Lloyd (recompute the
     centroids, re-solve the equal-size assignment) or Hartigan (single swaps of two
     points between groups, taken iff the exact change of the objective
     2 (c_b - c_a).(x_j - x_i) - 2 ||x_j - x_i||^2 / m is negative, m = F/E).
Keys: a neuron's gate column W_gate[:, j] (MoEfication clusters the first layer's
rows of a ReLU FFN; for SwiGLU, using the gate is our guess).
"""

import numpy as np
from scipy.optimize import linear_sum_assignment

from moejax.errors import ConfigError
from moejax.mixtures import kmeans

KINDS = ("random", "kmeans_lloyd", "kmeans_hartigan", "trajectory")


def check_groups(width: int, experts: int, where: str = "") -> int:
  """The group size F / E; ConfigError unless E divides F."""
  if experts < 1 or width % experts:
    raise ConfigError(
      f"{experts} experts must divide the dense FFN width d_ff={width} into equal groups{where}"
    )
  return width // experts


def split_ffn(w_gate, w_up, w_down, labels, experts: int) -> dict:
  """Expert weights {w_gate, w_up [E, d, F/E], w_down [E, F/E, d]} of the groups of
  `labels` [F] (neurons of a group in index order): sum of all experts = the FFN."""
  labels = np.asarray(labels)
  m = check_groups(labels.shape[0], experts)
  if np.bincount(labels, minlength=experts).tolist() != [m] * experts:
    raise ConfigError(
      f"the partition's groups must all hold {m} neurons "
      f"(sizes {np.bincount(labels, minlength=experts).tolist()})"
    )
  groups = np.stack([np.flatnonzero(labels == e) for e in range(experts)])  # [E, m]
  return {
    "w_gate": np.asarray(w_gate)[:, groups].transpose(1, 0, 2),
    "w_up": np.asarray(w_up)[:, groups].transpose(1, 0, 2),
    "w_down": np.asarray(w_down)[groups],
  }


def random_partition(width: int, experts: int, seed: int) -> np.ndarray:
  m = check_groups(width, experts)
  labels = np.empty(width, np.int32)
  labels[np.random.default_rng(seed).permutation(width)] = np.arange(width) // m
  return labels


def neuron_keys(w_gate) -> np.ndarray:
  """[F, d]: each neuron's gate column (module doc)."""
  return np.asarray(w_gate, np.float64).T


def objective(X, labels, experts: int) -> float:
  """sum_i ||x_i - c_{labels_i}||^2 (the k-means objective)."""
  X = np.asarray(X, np.float64)
  c = _centroids(X, labels, experts)
  return float(((X - c[labels]) ** 2).sum())


def balanced_kmeans(
  X, experts: int, algorithm: str, seed: int = 0, max_iter: int = 100
) -> tuple[np.ndarray, list[float]]:
  """(labels [F], objective after each balanced step) of balanced k-means of the
  points X [F, d] (module doc); the trace never increases."""
  X = np.asarray(X, np.float64)
  check_groups(X.shape[0], experts)
  if algorithm not in ("lloyd", "hartigan"):
    raise ConfigError(f"k-means algorithm must be lloyd or hartigan (algorithm={algorithm})")
  init = random_partition(X.shape[0], experts, seed)
  Xs = X / max(float(np.abs(X).max()), 1e-30)  # the shared code runs in float32
  run = (
    kmeans.lloyd(Xs, init, k=experts, max_iter=max_iter)
    if algorithm == "lloyd"
    else kmeans.hartigan(Xs, init, max_iter=max_iter, seed=seed, k=experts)
  )
  labels = np.asarray(run.labels)
  labels = balanced_assignment(X, _centroids(X, labels, experts))
  trace = [objective(X, labels, experts)]
  refine = _lloyd_balanced if algorithm == "lloyd" else _hartigan_swaps
  for _ in range(max_iter):
    labels, changed = refine(X, labels, experts)
    trace.append(objective(X, labels, experts))
    if not changed:
      break
  return labels, trace


def balanced_assignment(X, centroids) -> np.ndarray:
  """The equal-size assignment of the points X [F, d] to the centroids [E, d] with the
  least total squared distance (each centroid takes F / E points)."""
  X = np.asarray(X, np.float64)
  experts = centroids.shape[0]
  m = check_groups(X.shape[0], experts)
  cost = ((X[:, None, :] - centroids[None]) ** 2).sum(-1)  # [F, E]
  rows, slots = linear_sum_assignment(np.repeat(cost, m, axis=1))
  labels = np.empty(X.shape[0], np.int32)
  labels[rows] = slots // m
  return labels


def _centroids(X, labels, experts):
  counts = np.bincount(labels, minlength=experts).astype(np.float64)
  sums = np.zeros((experts, X.shape[1]))
  np.add.at(sums, labels, X)
  c = sums / np.maximum(counts, 1)[:, None]
  empty = counts == 0  # an emptied Lloyd cluster: a far point keeps it alive
  if empty.any():
    far = np.argsort(-((X - c[labels]) ** 2).sum(-1))[: int(empty.sum())]
    c[empty] = X[far]
  return c


def _lloyd_balanced(X, labels, experts):
  new = balanced_assignment(X, _centroids(X, labels, experts))
  if objective(X, new, experts) >= objective(X, labels, experts) - 1e-12:
    return labels, False  # the assignment solver may permute ties: keep the old labels
  return new, True


def _hartigan_swaps(X, labels, experts):
  """One sweep of improving swaps (module doc); centroids updated after each swap."""
  labels = labels.copy()
  m = X.shape[0] // experts
  c = _centroids(X, labels, experts)
  changed = False
  for i in range(X.shape[0]):
    a = labels[i]
    delta = X - X[i]
    gain = 2 * ((c[labels] - c[a]) * delta).sum(-1) - 2 * (delta**2).sum(-1) / m
    gain[labels == a] = np.inf
    j = int(np.argmin(gain))
    if gain[j] < -1e-9 * max(1.0, float(np.abs(gain[np.isfinite(gain)]).max())):
      b = labels[j]
      c[a] += (X[j] - X[i]) / m
      c[b] += (X[i] - X[j]) / m
      labels[i], labels[j] = b, a
      changed = True
  return labels, changed


def centroid_router(keys, labels, experts: int) -> np.ndarray:
  """[d, E]: each group's mean key (MoEfication-style similarity routing: a token
  scores expert e by x . mean key of e)."""
  return _centroids(np.asarray(keys, np.float64), labels, experts).T
