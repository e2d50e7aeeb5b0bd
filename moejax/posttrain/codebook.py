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
so its R must be applied online. The paper learns R from a Hadamard start:
`learn_rotation` (Cayley parametrisation, Adam) lowers the activation
quantization error of x R plus a weight-clustering term (ours); the learned R
is stored per expert input by expert type 'codebook_rotated' and applied
online (the paper folds one R into the residual stream instead).

Fine-tuning (`finetune_centroids`): the gradient of MSE(x W_hat, x W) over the
calibration inputs with respect to the centroids (jax.grad through `decode`,
the sum over each centroid's members) divided by its member count (the mean,
as CodeQuant), then an optax step. The returned centroids are the best seen
(our addition: the result never has a larger calibration error than the
input). Optional reassignment moves each weight to its nearest centroid, as
the released kmeans_recluster does when inputs and targets are the same
inputs; it can raise the output error, so its error is reported apart.
`recluster` is that step with the released weighted rule (and, optionally, a
mean update of the centroids; ours).
Guesses: optimizer, step count and lr (the paper: SGD); the router is not
handled here.

`decode`, `lut_matmul` and `hadamard` are the runtime code of the 'codebook'
expert type (moejax/experts/codebook.py), imported from there (one copy).
"""

from __future__ import annotations

import dataclasses
import functools

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


OPTIMIZERS = {"sgd": optax.sgd, "adam": optax.adam}


def padded_rows(x, d: int) -> tuple[jax.Array, jax.Array]:
  """(x as float32 [n_pad, d] zero-padded to the next power of two >= 16 rows, n).
  Every expert's calibration rows of one size share one compiled program; a zero
  row adds nothing to the sums the objectives take (nor, for a zero row, does the
  activation quantizer's rounding), which divide by the true n."""
  x = np.asarray(x, np.float32).reshape(-1, d)
  n = x.shape[0]
  n_pad = max(16, 1 << max(n - 1, 0).bit_length())
  return jnp.asarray(np.pad(x, ((0, n_pad - n), (0, 0)))), jnp.float32(max(n, 1))


def _centroid_error(c, idx, x, target, n, group_size: int):
  """MSE(x W_hat, x W) over the n real rows of the padded x."""
  out = jnp.matmul(x, decode(idx, c, group_size), precision=HIGHEST)
  return jnp.sum((out - target) ** 2) / (n * target.shape[-1])


@functools.partial(jax.jit, static_argnames=("group_size", "optimizer", "member_mean"))
def _centroid_step(c, state, idx, x, target, n, counts, lr, *, group_size, optimizer, member_mean):
  grad = jax.grad(_centroid_error)(c, idx, x, target, n, group_size)
  if member_mean:
    grad = grad / jnp.maximum(counts, 1.0)
  update, state = OPTIMIZERS[optimizer](lr).update(grad, state, c)
  c = optax.apply_updates(c, update)
  return c, state, _centroid_error(c, idx, x, target, n, group_size)


_centroid_error_jit = jax.jit(_centroid_error, static_argnames=("group_size",))


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
  if optimizer not in OPTIMIZERS:
    from moejax.errors import choice_error

    raise choice_error("optimizer", optimizer, OPTIMIZERS)
  x, n = padded_rows(x_calib, np.shape(W)[0])
  target = jnp.matmul(x, jnp.asarray(W, jnp.float32), precision=HIGHEST)
  idx = jnp.asarray(indices, jnp.int32)
  counts = jax.grad(lambda c: jnp.sum(decode(idx, c, group_size)))(
    jnp.zeros(np.shape(centroids), jnp.float32)
  )  # members per centroid
  lr = jnp.float32(lr)
  c = jnp.asarray(centroids, jnp.float32)
  state = OPTIMIZERS[optimizer](lr).init(c)
  errors = [float(_centroid_error_jit(c, idx, x, target, n, group_size=group_size))]
  best, best_error = c, errors[0]
  options = dict(group_size=group_size, optimizer=optimizer, member_mean=member_mean)
  for _ in range(steps):
    c, state, err = _centroid_step(c, state, idx, x, target, n, counts, lr, **options)
    errors.append(float(err))
    if errors[-1] < best_error:
      best, best_error = c, errors[-1]
  best_host = np.asarray(best)
  new_indices, reassigned_error = np.asarray(indices), None
  if reassign:
    new_indices = _nearest(np.asarray(W, np.float64), best_host, group_size)
    new_idx = jnp.asarray(new_indices, jnp.int32)
    reassigned_error = float(
      _centroid_error_jit(best, new_idx, x, target, n, group_size=group_size)
    )
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


@dataclasses.dataclass
class Rotation:
  """R [d, d] float32 orthogonal (the best seen), and the objective at the start
  and after each step (objectives[0]: R0)."""

  R: np.ndarray
  objectives: list


def _cayley(R0, P):
  """R0 (I + A)^-1 (I - A), A = P - P^T skew: orthogonal for any P, R0 at P = 0."""
  A = P - P.T
  eye = jnp.eye(P.shape[0], dtype=P.dtype)
  return R0 @ jnp.linalg.solve(eye + A, eye - A)


def rotation_objective(R, x, W, act_bits: int, bits: int, weight_term: float):
  """act + weight_term * wgt (jnp), both relative errors: act = ||Q(xR) - xR||^2 /
  ||x||^2 with Q the activation quantizer (compressed.fake_quant, rounding not
  differentiated); wgt = ||R^T W - nearest||^2 / ||W||^2, nearest: each weight of
  R^T W at its nearest of 2^bits quantile centroids per output column over the
  whole input (the paper's granularity; held fixed in the gradient)."""
  from moejax.experts.compressed import fake_quant
  from moejax.experts.codebook import quantile_codebook

  y = jnp.matmul(x, R, precision=HIGHEST)
  q = fake_quant(y, act_bits, straight_through=False)
  act = jnp.sum((q - y) ** 2) / jnp.sum(x**2)
  if not weight_term:
    return act
  V = jnp.matmul(R.T, W, precision=HIGHEST)
  indices, centroids = quantile_codebook(V, bits, V.shape[0], per_output_column=True)
  near = jax.lax.stop_gradient(decode(indices, centroids.reshape(1, V.shape[1], -1), V.shape[0]))
  return act + weight_term * jnp.sum((V - near) ** 2) / jnp.sum(W**2)


def _rotation_value(P, R0, x, W, *, act_bits, bits, weight_term):
  return rotation_objective(_cayley(R0, P), x, W, act_bits, bits, weight_term)


ROTATION_STATIC = ("act_bits", "bits", "weight_term")
_rotation_value_jit = jax.jit(_rotation_value, static_argnames=ROTATION_STATIC)


@functools.partial(jax.jit, static_argnames=ROTATION_STATIC)
def _rotation_step(P, state, R0, x, W, lr, **static):
  grad = jax.grad(_rotation_value)(P, R0, x, W, **static)
  update, state = optax.adam(lr).update(grad, state, P)
  P = optax.apply_updates(P, update)
  return P, state, _rotation_value(P, R0, x, W, **static)


def learn_rotation(
  x,
  W,
  act_bits: int,
  bits: int = 4,
  *,
  steps: int = 150,
  lr: float = 3e-3,
  weight_term: float = 0.1,
  R0=None,
) -> Rotation:
  """CodeQuant's learned rotation: R = R0 C(A) (Cayley, `_cayley`), from R0
  (default the Hadamard matrix), Adam on `rotation_objective` over the
  calibration inputs x [n, d] and the weight W [d, d_out] it rotates (x W =
  (x R)(R^T W)). The released code minimises the activation term alone
  (weight_term=0) with Adam at lr 1e-4 over 4 epochs; the weight term, its weight,
  the step count and lr are ours (on planted outlier channels, weight_term 1
  traded the activation gain away; tests/posttrain/test_codebook.py). The best R
  seen is returned, recomputed in float64 (orthogonal to float32 rounding)."""
  W = jnp.asarray(W, jnp.float32)
  d = W.shape[0]
  x, _ = padded_rows(x, d)  # zero rows add nothing to either sum of the objective
  R0 = np.asarray(hadamard(d) if R0 is None else R0, np.float64)
  R0_32 = jnp.asarray(R0, jnp.float32)
  static = dict(act_bits=act_bits, bits=bits, weight_term=weight_term)
  lr = jnp.float32(lr)
  P = jnp.zeros((d, d), jnp.float32)
  state = optax.adam(lr).init(P)
  objectives = [float(_rotation_value_jit(P, R0_32, x, W, **static))]
  best, best_value = P, objectives[0]
  for _ in range(steps):
    P, state, value = _rotation_step(P, state, R0_32, x, W, lr, **static)
    objectives.append(float(value))
    if objectives[-1] < best_value:
      best, best_value = P, objectives[-1]
  A = np.asarray(best, np.float64)
  A = A - A.T
  R = R0 @ np.linalg.solve(np.eye(d) + A, np.eye(d) - A)
  return Rotation(R.astype(np.float32), objectives)


def recluster(W, centroids, group_size: int, inputs=None, targets=None, *, update=False):
  """CodeQuant's re-clustering after centroid fine-tuning (the released
  kmeans_recluster): each weight of W [d_in, d_out] to the centroid c of its group
  minimising (w b_r - a_r c)^2 for its input row r, a_r = mean x_r^2 and b_r =
  mean x_r xt_r over the calibration inputs x [n, d_in] and the inputs xt the
  quantized model sees (targets; default x: then b = a and it is the nearest
  centroid; no inputs: the nearest). The released code keeps the centroids;
  update=True then moves each used centroid to the mean of its weights (a
  Lloyd's step; ours). Returns (indices uint8 [d_in, d_out], centroids)."""
  W = np.asarray(W, np.float64)
  scale = np.ones(W.shape[0])
  if inputs is not None:
    x = np.asarray(inputs, np.float64).reshape(-1, W.shape[0])
    xt = x if targets is None else np.asarray(targets, np.float64).reshape(x.shape)
    a = np.maximum(np.mean(x * x, axis=0), 1e-6)  # the released eps
    scale = np.mean(x * xt, axis=0) / a
  indices = _nearest(W * scale[:, None], centroids, group_size)
  centroids = np.asarray(centroids, np.float32)
  if update:
    per_column = centroids.ndim == 3
    V = _to_groups(W, group_size, per_column)
    assign = _to_groups(indices.astype(np.int64), group_size, per_column)
    flat = centroids.reshape(len(V), -1)
    K = flat.shape[1]
    index = (np.arange(len(V))[:, None] * K + assign).ravel()
    sums = np.bincount(index, V.ravel(), len(V) * K).reshape(-1, K)
    counts = np.bincount(index, minlength=len(V) * K).reshape(-1, K)
    means = np.where(counts > 0, sums / np.maximum(counts, 1), flat)
    centroids = means.reshape(centroids.shape).astype(np.float32)
  return indices, centroids


def sort_book(indices, centroids, group_size: int):
  """(indices, centroids) with each codebook sorted ascending and its indices
  renumbered to match (W_hat unchanged)."""
  centroids = np.asarray(centroids)
  per_column = centroids.ndim == 3
  V = _to_groups(np.asarray(indices, np.int64), group_size, per_column)
  flat = centroids.reshape(len(V), -1)
  order = np.argsort(flat, axis=-1, kind="stable")
  rank = np.argsort(order, axis=-1)
  new = _from_groups(np.take_along_axis(rank, V, -1), np.shape(indices), group_size, per_column)
  sorted_flat = np.take_along_axis(flat, order, -1)
  return new.astype(np.uint8), sorted_flat.reshape(centroids.shape).astype(centroids.dtype)
