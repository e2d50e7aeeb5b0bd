"""CodeQuant (ICLR 2026, arXiv 2604.10496): per-group k-means codebooks for a
weight W [d_in, d_out] (x @ W), a rotation before clustering, a lookup-table
(LUT) matmul, and centroid fine-tuning on calibration inputs.

Groups (`kmeans_group_quant`): rows of W in blocks of `group_size` input dims.
By default a group is the block of group_size rows across every output column
(centroids [d_in / group_size, K], K = 2^bits; one table of x . centroid
products per group serves every output, the LUT's point). With
per_output_column=True each output column of a block has its own codebook
(centroids [d_in / group_size, d_out, K]): the released code's grouping
(SAI-Lab-NYU/CodeQuant, utils/tensor_utils.py reshapes the torch weight
[out, in] to rows of group_size input weights of one output). Indices are uint8
[d_in, d_out]; centroids of a group are sorted ascending. Clustering is scalar
Lloyd's k-means from k-means++ (as the released code) or quantile init, run in
float64 on the host until no assignment changes; an empty cluster is reseeded
on the value farthest from its centroid (`_reseed`; the released code zeroes it:
either way no stale centroid is kept); `history` is the objective
sum (w - c[index])^2 after each assignment, which never increases.

Rotation: for orthogonal R, x @ W = (x @ R) @ (R^T W); `rotate` returns R^T W,
the matrix to cluster. R is either applied online to the input (a Hadamard
matrix costs O(d log d) as a fast Walsh-Hadamard transform) or folded into a
preceding linear op h @ W_prev (store W_prev @ R). An expert's w_gate / w_up
follow an RMSNorm, so folding needs the whole residual stream rotated (norm
scale folded into the next weights first); w_down follows the SwiGLU product,
so its R must be applied online. The paper learns R from a Hadamard start;
here R is given (difference: no rotation learning).

Fine-tuning (`finetune_centroids`): the gradient of MSE(x W_hat, x W) over the
calibration inputs with respect to the centroids (jax.grad through `decode`,
the sum over each centroid's members) divided by its member count (the mean,
as CodeQuant), then an optax step. The returned centroids are the best seen
(our addition: the result never has a larger calibration error than the
input). Optional reassignment moves each weight to its nearest centroid, as
the released kmeans_recluster does when inputs and targets are the same
inputs; it can raise the output error, so its error is reported apart.
Guesses: optimizer, step count and lr (the paper: SGD); the router is not
handled here.

`decode`, `lut_matmul` and `hadamard` are the runtime code of the 'codebook'
expert type (moejax/experts/codebook.py), imported from there (one copy).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from moejax.experts.codebook import decode, hadamard, lut_matmul  # noqa: F401  (re-exported)
from moejax.posttrain.methods import INITS
from moejax.posttrain.quantize import check_grouping

HIGHEST = jax.lax.Precision.HIGHEST


@dataclasses.dataclass
class Codebook:
  """indices uint8 [d_in, d_out]; centroids float32 [G, K] or [G, d_out, K]
  (G = d_in / group_size); history: the k-means objective per iteration."""

  indices: np.ndarray
  centroids: np.ndarray
  group_size: int
  history: list

  def dequantize(self) -> np.ndarray:
    """W_hat [d_in, d_out] float32, decoded as the 'codebook' expert type decodes."""
    return np.asarray(decode(self.indices, self.centroids, self.group_size), np.float32)


def _to_groups(W, group_size, per_output_column):
  """W [d_in, d_out] -> the values of each group, one group a row."""
  d_in, d_out = W.shape
  blocks = W.reshape(d_in // group_size, group_size, d_out)
  if per_output_column:
    return blocks.transpose(0, 2, 1).reshape(-1, group_size)
  return blocks.reshape(d_in // group_size, -1)


def _from_groups(values, shape, group_size, per_output_column):
  d_in, d_out = shape
  if per_output_column:
    blocks = values.reshape(d_in // group_size, d_out, group_size).transpose(0, 2, 1)
  else:
    blocks = values.reshape(d_in // group_size, group_size, d_out)
  return blocks.reshape(d_in, d_out)


def _kmeans_pp(V, K, rng):
  """k-means++ (D^2 sampling) centroids [N, K] for every row of V [N, M]."""
  rows = np.arange(len(V))
  centroids = np.empty((len(V), K))
  centroids[:, 0] = V[rows, rng.integers(0, V.shape[1], len(V))]
  dist = (V - centroids[:, :1]) ** 2
  for k in range(1, K):
    cumulative = np.cumsum(dist, axis=1)
    draw = rng.random(len(V)) * cumulative[:, -1]
    pick = np.minimum((cumulative < draw[:, None]).sum(axis=1), V.shape[1] - 1)
    centroids[:, k] = V[rows, pick]
    dist = np.minimum(dist, (V - centroids[:, k : k + 1]) ** 2)
  return centroids


def _assign(V, sorted_centroids):
  """Nearest centroid of each value (ties to the lower one), centroids sorted."""
  middle = (sorted_centroids[:, 1:] + sorted_centroids[:, :-1]) / 2
  rows = max(1, 2**26 // (V.shape[1] * max(middle.shape[1], 1)))  # ~64 MB of compares
  return np.concatenate(
    [
      (V[i : i + rows, :, None] > middle[i : i + rows, None, :]).sum(axis=2)
      for i in range(0, len(V), rows)
    ]
  )


def _reseed(V, centroids, assign, empty) -> bool:
  """Move each empty cluster's centroid (in place) onto the value farthest from its
  own centroid, a different value per empty cluster of a row (the farthest first);
  a row whose values all sit on centroids keeps its empties. True if any moved.
  A stale centroid no weight uses wastes a code; reseeding lowers the objective
  (the moved value's error drops to 0, then Lloyd's steps never raise it)."""
  moved = False
  for i in np.flatnonzero(empty.any(axis=1)):
    dist = (V[i] - centroids[i, assign[i]]) ** 2
    order = np.argsort(-dist, kind="stable")
    for k, j in zip(np.flatnonzero(empty[i]), order):
      if dist[j] <= 0:
        break
      centroids[i, k] = V[i, j]
      moved = True
  return moved


def _lloyd(V, centroids, iterations):
  """Lloyd's iterations on each row of V; returns (centroids, assignment, history)."""
  N, K = centroids.shape
  flat_group = np.repeat(np.arange(N) * K, V.shape[1])
  centroids = np.sort(centroids, axis=1)
  assign = _assign(V, centroids)
  history = [float(np.sum((V - np.take_along_axis(centroids, assign, 1)) ** 2))]
  for _ in range(iterations):
    index = flat_group + assign.ravel()
    sums = np.bincount(index, weights=V.ravel(), minlength=N * K).reshape(N, K)
    counts = np.bincount(index, minlength=N * K).reshape(N, K)
    centroids = np.where(counts > 0, sums / np.maximum(counts, 1), centroids)
    reseeded = _reseed(V, centroids, assign, counts == 0)
    centroids = np.sort(centroids, axis=1)
    new = _assign(V, centroids)
    history.append(float(np.sum((V - np.take_along_axis(centroids, new, 1)) ** 2)))
    converged = np.array_equal(new, assign) and not reseeded
    assign = new
    if converged:
      break
  return centroids, assign, history


def kmeans_group_quant(
  W,
  bits: int,
  group_size: int,
  *,
  iterations: int = 100,
  init: str = "kmeans++",
  seed: int = 0,
  per_output_column: bool = False,
) -> Codebook:
  """2^bits scalar k-means centroids per group of W [d_in, d_out] (module doc)."""
  W = np.asarray(W, np.float64)
  check_grouping(bits, group_size, W.shape[0])
  if init not in INITS:
    from moejax.errors import choice_error

    raise choice_error("init", init, INITS)
  V = _to_groups(W, group_size, per_output_column)
  K = 2**bits
  if init == "quantile":
    start = np.quantile(V, (np.arange(K) + 0.5) / K, axis=1).T
  else:
    start = _kmeans_pp(V, K, np.random.default_rng(seed))
  centroids, assign, history = _lloyd(V, start, iterations)
  shape = (W.shape[0] // group_size, W.shape[1], K) if per_output_column else (-1, K)
  indices = _from_groups(assign, W.shape, group_size, per_output_column)
  return Codebook(
    indices.astype(np.uint8), centroids.reshape(shape).astype(np.float32), group_size, history
  )


def kmeans_experts(
  W,
  bits: int,
  group_size: int,
  hessians=None,
  *,
  iterations: int = 100,
  init: str = "kmeans++",
  seed: int = 0,
) -> list[Codebook]:
  """The quantizer 'kmeans' (methods.QUANTIZERS): `kmeans_group_quant` of each W[e] of
  W [E, d_in, d_out], seeded seed + e; it reads no hessians."""
  return [
    kmeans_group_quant(w, bits, group_size, iterations=iterations, init=init, seed=seed + e)
    for e, w in enumerate(np.asarray(W))
  ]


def rotate(W, R) -> np.ndarray:
  """R^T W (float32, computed in float64): the weight for inputs x @ R, R orthogonal."""
  return (np.asarray(R, np.float64).T @ np.asarray(W, np.float64)).astype(np.float32)


@dataclasses.dataclass
class Finetuned:
  """Best centroids seen, indices (reassigned when asked), errors[0] the
  initial and errors[t] the calibration MSE after step t, and the MSE after
  reassignment (None when not asked)."""

  centroids: np.ndarray
  indices: np.ndarray
  errors: list
  reassigned_error: float | None


def finetune_centroids(
  x_calib,
  W,
  indices,
  centroids,
  group_size: int,
  steps: int = 100,
  lr: float = 1e-2,
  *,
  optimizer: str = "sgd",
  member_mean: bool = True,
  reassign: bool = False,
) -> Finetuned:
  """Centroids tuned by optax on MSE(x W_hat, x W) over x_calib [..., d_in] (module doc)."""
  x = jnp.asarray(x_calib, jnp.float32).reshape(-1, np.shape(W)[0])
  target = jnp.matmul(x, jnp.asarray(W, jnp.float32), precision=HIGHEST)
  idx = jnp.asarray(indices, jnp.int32)
  opt = {"sgd": optax.sgd, "adam": optax.adam}
  if optimizer not in opt:
    from moejax.errors import choice_error

    raise choice_error("optimizer", optimizer, opt)
  tx = opt[optimizer](lr)

  def error(c, idx):
    out = jnp.matmul(x, decode(idx, c, group_size), precision=HIGHEST)
    return jnp.mean((out - target) ** 2)

  members = jnp.ones(idx.shape, jnp.float32)
  counts = jax.grad(lambda c: jnp.sum(decode(idx, c, group_size) * members))(
    jnp.zeros(np.shape(centroids), jnp.float32)
  )  # members per centroid

  @jax.jit
  def step(c, state):
    grad = jax.grad(error)(c, idx)
    if member_mean:
      grad = grad / jnp.maximum(counts, 1.0)
    update, state = tx.update(grad, state, c)
    c = optax.apply_updates(c, update)
    return c, state, error(c, idx)

  c = jnp.asarray(centroids, jnp.float32)
  state = tx.init(c)
  errors = [float(jax.jit(error)(c, idx))]
  best, best_error = c, errors[0]
  for _ in range(steps):
    c, state, err = step(c, state)
    errors.append(float(err))
    if errors[-1] < best_error:
      best, best_error = c, errors[-1]
  best_host = np.asarray(best)
  new_indices, reassigned_error = np.asarray(indices), None
  if reassign:
    new_indices = _nearest(np.asarray(W, np.float64), best_host, group_size)
    reassigned_error = float(jax.jit(error)(best, jnp.asarray(new_indices, jnp.int32)))
  return Finetuned(best_host, new_indices, errors, reassigned_error)


def _nearest(W, centroids, group_size):
  """uint8 [d_in, d_out] index of each weight's nearest centroid in its group."""
  per_column = centroids.ndim == 3
  V = _to_groups(W, group_size, per_column)
  C = np.asarray(centroids, np.float64).reshape(len(V), -1)
  order = np.argsort(C, axis=1)
  rank = _assign(V, np.take_along_axis(C, order, 1))
  assign = np.take_along_axis(order, rank, 1)
  return _from_groups(assign, W.shape, group_size, per_column).astype(np.uint8)
