"""CodeQuant codebooks (moejax/posttrain/codebook.py): Lloyd's objective and
fixed point, the LUT matmul against decode-then-matmul, rotations, exactness,
outliers against RTN int4, and centroid fine-tuning against the least-squares
optimum of the centroids."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.errors import ConfigError
from moejax.posttrain import codebook as cb
from moejax.posttrain import quantize as qz

LAYOUTS = {"shared": False, "per_output_column": True}


def decoded(book):
  return np.asarray(cb.decode(book.indices, book.centroids, book.group_size))


def group_members(book, W):
  """(values, indices, centroids) of each group, one group a row (float64)."""
  per_column = book.centroids.ndim == 3
  values = cb._to_groups(np.asarray(W, np.float64), book.group_size, per_column)
  indices = cb._to_groups(book.indices.astype(np.int64), book.group_size, per_column)
  return values, indices, book.centroids.reshape(len(values), -1).astype(np.float64)


@settings(max_examples=40)
@given(
  seed=st.integers(0, 2**16),
  group_size=st.sampled_from([2, 4, 8]),
  groups=st.integers(1, 3),
  d_out=st.integers(1, 6),
  bits=st.sampled_from([2, 3]),
  init=st.sampled_from(cb.INITS),
  per_output_column=st.booleans(),
  ties=st.booleans(),
)
def test_kmeans_objective_never_increases_and_ends_at_a_lloyd_fixed_point(
  seed, group_size, groups, d_out, bits, init, per_output_column, ties
):
  rng = np.random.default_rng(seed)
  W = rng.normal(size=(groups * group_size, d_out)) * rng.uniform(0.1, 5)
  if ties:  # repeated values and exact midpoints
    W = np.round(W * 2) / 2
  W = W.astype(np.float32)
  book = cb.kmeans_group_quant(
    W, bits, group_size, iterations=1000, init=init, seed=seed, per_output_column=per_output_column
  )
  history = np.asarray(book.history)
  assert np.all(np.diff(history) <= 1e-12 * history[0]), history
  values, indices, centroids = group_members(book, W)
  chosen = np.take_along_axis(centroids, indices, 1)
  scale = np.abs(values).max() + 1e-30
  np.testing.assert_allclose(
    np.sum((values - chosen) ** 2), history[-1], rtol=1e-5, atol=1e-10 * scale**2
  )
  nearest = np.abs(values[:, :, None] - centroids[:, None, :]).min(2)
  assert np.all(np.abs(values - chosen) <= nearest + 1e-6 * scale)
  for g in range(len(values)):  # every used centroid is its members' mean
    for k in np.unique(indices[g]):
      np.testing.assert_allclose(
        centroids[g, k], values[g][indices[g] == k].mean(), atol=1e-6 * scale
      )


def best_1d_kmeans(values, K):
  """The optimal 1-D k-means objective by brute force: optimal clusters are
  contiguous runs of the sorted values, so try every split into K runs."""
  import itertools

  v = np.sort(np.asarray(values, np.float64))
  best = np.inf
  for cuts in itertools.combinations(range(1, len(v)), K - 1):
    runs = np.split(v, cuts)
    best = min(best, sum(float(np.sum((r - r.mean()) ** 2)) for r in runs))
  return best


def test_an_empty_cluster_is_reseeded_not_kept_stale():
  """Quantile init on a group with many repeated values starts with duplicate
  centroids, so a cluster is empty; a stale centroid (the old behaviour) leaves a
  code unused and the objective far above the optimum; reseeded on the farthest
  value, k-means reaches the brute-force optimum with every code used."""
  group = np.array([0.0] * 10 + [1.0, 2.0, 9.0, 10.0, 20.0, 21.0])
  book = cb.kmeans_group_quant(group[:, None].astype(np.float32), 2, 16, init="quantile")
  assert sorted(np.unique(book.indices).tolist()) == [0, 1, 2, 3]
  optimum = best_1d_kmeans(group, 4)
  np.testing.assert_allclose(book.history[-1], optimum, rtol=1e-9)
  assert optimum == 1.5  # the stale centroid ended at 122.5 with code 1 unused


@settings(max_examples=40)
@given(
  seed=st.integers(0, 2**16),
  bits=st.sampled_from([2, 3]),
  init=st.sampled_from(cb.INITS),
  repeats=st.integers(0, 12),
)
def test_every_code_is_used_when_a_group_has_enough_distinct_values(seed, bits, init, repeats):
  """A small group (16 values, some repeated) with at least K distinct values: at
  the end every one of the K centroids has members, and the objective is within
  the brute-force optimum's reach (never below it)."""
  rng = np.random.default_rng(seed)
  K = 2**bits
  values = rng.normal(size=16 - repeats)
  group = np.concatenate([values, np.full(repeats, values[0])])
  if len(np.unique(group)) < K:
    return
  book = cb.kmeans_group_quant(
    group[:, None].astype(np.float32), bits, 16, iterations=1000, init=init, seed=seed
  )
  assert len(np.unique(book.indices)) == K
  if bits == 2:
    assert book.history[-1] >= best_1d_kmeans(group.astype(np.float32), K) * (1 - 1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_lut_matmul_equals_decode_then_matmul(layout, bits):
  rng = np.random.default_rng(bits)
  d_in, d_out, group_size = 32, 24, 8
  K = 2**bits
  shape = (d_in // group_size, d_out, K) if LAYOUTS[layout] else (d_in // group_size, K)
  centroids = rng.normal(size=shape).astype(np.float32)
  indices = rng.integers(0, K, size=(d_in, d_out)).astype(np.uint8)
  x = rng.normal(size=(2, 3, d_in)).astype(np.float32)
  W_hat = np.asarray(cb.decode(indices, centroids, group_size))
  if LAYOUTS[layout]:
    expected = centroids[np.arange(d_in)[:, None] // group_size, np.arange(d_out), indices]
  else:
    expected = centroids[np.arange(d_in)[:, None] // group_size, indices]
  np.testing.assert_array_equal(W_hat, expected)
  y = np.asarray(cb.lut_matmul(x, indices, centroids, group_size))
  reference = x.astype(np.float64) @ W_hat.astype(np.float64)
  assert y.shape == (2, 3, d_out) and y.dtype == np.float32
  np.testing.assert_allclose(y, reference, atol=1e-5 * np.abs(reference).max(), rtol=0)


def test_hadamard_and_random_rotations_leave_the_output_unchanged():
  rng = np.random.default_rng(0)
  n = 64
  W = rng.normal(size=(n, 32)).astype(np.float32)
  W[5, 3] = 40.0  # an outlier
  x = rng.normal(size=(16, n)).astype(np.float32)
  H = cb.hadamard(n)
  np.testing.assert_allclose(H @ H.T, np.eye(n), atol=1e-6)
  np.testing.assert_allclose(np.abs(H), 1 / np.sqrt(n), rtol=1e-7)
  np.testing.assert_array_equal(cb.hadamard(1), [[1.0]])
  random_orthogonal = np.linalg.qr(rng.normal(size=(n, n)))[0].astype(np.float32)
  y = x @ W
  for R in (H, random_orthogonal):
    y_rotated = (x @ R) @ cb.rotate(W, R)
    assert y_rotated.dtype == np.float32
    np.testing.assert_allclose(y_rotated, y, atol=1e-5 * np.abs(y).max(), rtol=0)
  assert np.abs(cb.rotate(W, H)).max() < np.abs(W).max() / 3  # the outlier is spread
  for n in (0, 3, 12):
    with pytest.raises(ConfigError, match=f"n={n}"):
      cb.hadamard(n)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bits", [2, 3])
def test_codebook_is_exact_with_a_centroid_per_distinct_value(layout, bits):
  rng = np.random.default_rng(bits)
  d_in, d_out, group_size, K = 32, 8, 16, 2**bits
  per_column = LAYOUTS[layout]
  W = np.empty((d_in, d_out), np.float32)
  for g in range(d_in // group_size):
    for j in range(d_out) if per_column else [slice(None)]:
      block = W[g * group_size : (g + 1) * group_size, j]
      distinct = rng.normal(size=K).astype(np.float32)
      block[...] = rng.permutation(np.resize(distinct, block.size)).reshape(block.shape)
  book = cb.kmeans_group_quant(W, bits, group_size, per_output_column=per_column)
  np.testing.assert_array_equal(decoded(book), W)
  assert book.history[-1] == 0.0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_outlier_gets_its_own_centroid_and_beats_rtn_int4(layout):
  per_column = LAYOUTS[layout]
  d_in, d_out, group_size = 128, 64, 32
  for seed in range(3):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d_in, d_out)).astype(np.float32)
    outliers = []
    for g in range(d_in // group_size):  # one positive and one negative per block
      for sign in (1, -1):
        r, c = g * group_size + rng.integers(group_size), rng.integers(d_out)
        W[r, c] = sign * rng.uniform(20, 30)
        outliers.append((r, c))
    book = cb.kmeans_group_quant(W, 4, group_size, seed=seed, per_output_column=per_column)
    W_hat = decoded(book)
    for r, c in outliers:
      rows = slice(r // group_size * group_size, (r // group_size + 1) * group_size)
      group = book.indices[rows, c] if per_column else book.indices[rows]
      assert np.sum(group == book.indices[r, c]) == 1 and W_hat[r, c] == W[r, c]
    codebook_mse = np.mean((W - W_hat) ** 2)
    rtn_mse = np.mean((W - qz.dequantize(qz.rtn(W, 4, group_size))) ** 2)
    print(
      f"{layout} seed {seed}: 4-bit weight MSE codebook {codebook_mse:.4f}, "
      f"RTN int4 {rtn_mse:.4f} (ratio {codebook_mse / rtn_mse:.3f})"
    )
    assert codebook_mse < rtn_mse


def finetune_case(seed=0, d_in=32, d_out=16, group_size=8, bits=2, n=128):
  """Inputs with feature scales over two decades (so weight-space k-means is not
  output-optimal), the k-means book, and the least-squares optimum of the output
  MSE over the centroids with the indices fixed, with its Hessian (float64)."""
  rng = np.random.default_rng(seed)
  W = rng.normal(size=(d_in, d_out)).astype(np.float32)
  x = (rng.normal(size=(n, d_in)) * np.geomspace(0.05, 5, d_in)).astype(np.float32)
  book = cb.kmeans_group_quant(W, bits, group_size, seed=seed)
  K = 2**bits
  design = np.zeros((n, d_out, d_in // group_size * K))  # out = design @ vec(centroids)
  for r in range(d_in):
    design[:, np.arange(d_out), r // group_size * K + book.indices[r]] += x[:, r : r + 1]
  design = design.reshape(n * d_out, -1)
  target = (x.astype(np.float64) @ W).ravel()
  best = np.linalg.lstsq(design, target, rcond=None)[0]
  optimum = np.mean((design @ best - target) ** 2)
  return x, W, book, optimum, 2 * design.T @ design / (n * d_out)


def test_sgd_finetuning_never_increases_the_calibration_error():
  x, W, book, optimum, hessian = finetune_case()
  counts = np.bincount((np.arange(32)[:, None] // 8 * 4 + book.indices).ravel(), minlength=16)
  precondition = np.diag(1 / np.sqrt(np.maximum(counts, 1)))  # the member-mean step
  lr = 1.0 / np.linalg.eigvalsh(precondition @ hessian @ precondition).max()
  result = cb.finetune_centroids(x, W, book.indices, book.centroids, 8, steps=60, lr=lr)
  errors = np.asarray(result.errors)
  print(
    f"SGD lr={lr:.3f}: calibration MSE {errors[0]:.4f} -> {errors[-1]:.4f}, "
    f"least-squares optimum {optimum:.4f}"
  )
  assert np.all(np.diff(errors) <= 1e-6 * errors[0])
  assert errors[-1] < errors[0] and np.all(errors >= optimum * (1 - 1e-5))


def test_adam_finetuning_reaches_the_least_squares_centroids():
  x, W, book, optimum, _ = finetune_case(seed=1)
  shrunk = book.centroids * 0.5  # far from optimal: fine-tuning must recover
  result = cb.finetune_centroids(
    x, W, book.indices, shrunk, 8, steps=200, lr=0.05, optimizer="adam", reassign=True
  )
  errors = np.asarray(result.errors)
  best = np.asarray(cb.finetune_centroids(x, W, book.indices, result.centroids, 8, steps=0).errors)[
    0
  ]
  print(
    f"Adam: calibration MSE {errors[0]:.4f} -> best {best:.4f}, "
    f"least-squares optimum {optimum:.4f}, after reassignment {result.reassigned_error:.4f}"
  )
  assert best == min(errors) <= errors[0]
  assert np.all(errors >= optimum * (1 - 1e-5))
  assert best - optimum <= 1e-3 * (errors[0] - optimum)
  values, indices, centroids = group_members(
    cb.Codebook(result.indices, result.centroids, 8, []), W
  )
  chosen = np.take_along_axis(centroids, indices, 1)
  assert np.all(
    np.abs(values - chosen) <= np.abs(values[:, :, None] - centroids[:, None, :]).min(2) + 1e-6
  )


def test_refusals_name_the_value():
  W = np.zeros((64, 8), np.float32)
  with pytest.raises(ConfigError, match="bits=5"):
    cb.kmeans_group_quant(W, 5, 16)
  with pytest.raises(ConfigError, match="group_size=24.*d_in=64"):
    cb.kmeans_group_quant(W, 4, 24)
  with pytest.raises(ConfigError, match="init='random'"):
    cb.kmeans_group_quant(W, 4, 16, init="random")
  with pytest.raises(ConfigError, match="optimizer='lbfgs'"):
    cb.finetune_centroids(
      np.zeros((4, 64)),
      W,
      np.zeros((64, 8), np.uint8),
      np.zeros((4, 16)),
      16,
      steps=1,
      optimizer="lbfgs",
    )


def test_history_starts_at_the_objective_of_the_initial_centroids():
  """iterations=0: the centroids are the initial ones and history holds exactly one
  value, the objective of assigning every weight to its nearest centroid (computed
  here from the returned book), on 3 groups of 4 rows x 5 columns."""
  W = np.random.default_rng(4).normal(size=(12, 5)).astype(np.float32)
  book = cb.kmeans_group_quant(W, 2, 4, iterations=0, seed=1)
  values, _, centroids = group_members(book, W)
  nearest = np.min((values[:, :, None] - centroids[:, None, :]) ** 2, axis=2)
  assert len(book.history) == 1
  np.testing.assert_allclose(book.history[0], nearest.sum(), rtol=1e-6)
  assert book.history[0] > 0


def test_one_default_sgd_step_moves_a_centroid_by_the_documented_rate():
  """One weight (d_in = d_out = 1), x = 1, its centroid 0: MSE = (0 - 1)^2 = 1 with
  gradient -2 and one member, so one SGD step at the default lr = 1e-2 gives 0.02 and
  MSE 0.98^2; the other centroid has no member and does not move."""
  result = cb.finetune_centroids(
    np.ones((1, 1)), np.ones((1, 1)), np.zeros((1, 1), np.uint8), np.array([[0.0, 5.0]]), 1, steps=1
  )
  np.testing.assert_allclose(result.centroids, [[0.02, 5.0]], rtol=1e-6)
  np.testing.assert_allclose(result.errors, [1.0, 0.98**2], rtol=1e-6)


def outlier_inputs(seed, n=256, d=32, channels=(3, 17), scale=25.0):
  """Standard normal rows with a few planted outlier channels (scaled up)."""
  x = np.random.default_rng(seed).standard_normal((n, d))
  x[:, list(channels)] *= scale
  return x.astype(np.float32)


def act_error(x, R, bits):
  """||Q(x R) - x R||^2 / ||x||^2 by the numpy per-token min-max grid."""
  y = np.asarray(x, np.float64) if R is None else np.asarray(x, np.float64) @ R
  low, high = y.min(1, keepdims=True), y.max(1, keepdims=True)
  scale = np.maximum((high - low) / (2**bits - 1), 1e-5)
  q = np.round((y - low) / scale) * scale + low
  return float(np.sum((q - y) ** 2) / np.sum(np.asarray(x, np.float64) ** 2))


@pytest.fixture(scope="module")
def learned():
  """A rotation learned on calibration inputs with planted outlier channels, W4A4."""
  W = np.random.default_rng(7).standard_normal((32, 24)).astype(np.float32)
  return cb.learn_rotation(outlier_inputs(0, n=512), W, act_bits=4, bits=4), W


def test_the_learned_rotation_is_orthogonal_and_leaves_the_float_output_unchanged(learned):
  rotation, W = learned
  R = rotation.R.astype(np.float64)
  assert rotation.R.dtype == np.float32
  np.testing.assert_allclose(R.T @ R, np.eye(32), rtol=0, atol=1e-6)
  assert np.abs(R - cb.hadamard(32)).max() > 1e-2  # it moved from its Hadamard start
  x = outlier_inputs(1, n=16)
  want = x.astype(np.float64) @ W
  got = (x @ rotation.R) @ cb.rotate(W, rotation.R)  # float32: (x R) (R^T W)
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_learned_rotation_lowers_the_activation_quantization_error(learned):
  """On held-out rows of the same planted-outlier distribution: learned R below
  the fixed Hadamard matrix, which is below no rotation; the objective it
  minimised fell from its Hadamard start."""
  rotation, _ = learned
  held_out = outlier_inputs(2)
  none = act_error(held_out, None, 4)
  fixed = act_error(held_out, cb.hadamard(32).astype(np.float64), 4)
  tuned = act_error(held_out, rotation.R.astype(np.float64), 4)
  assert tuned < fixed < none, (tuned, fixed, none)
  assert min(rotation.objectives) < rotation.objectives[0]


def brute_force_recluster(W, centroids, group_size, x, xt):
  """argmin_c (w b_r - a_r c)^2 over each weight's own codebook, one weight at a time."""
  d_in, d_out = W.shape
  a = np.maximum(np.mean(x * x, 0), 1e-6)
  b = np.mean(x * xt, 0)
  out = np.zeros(W.shape, np.int64)
  for r in range(d_in):
    for j in range(d_out):
      book = centroids[r // group_size, j] if centroids.ndim == 3 else centroids[r // group_size]
      out[r, j] = np.argmin((W[r, j] * b[r] - a[r] * book.astype(np.float64)) ** 2)
  return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_recluster_is_the_brute_force_assignment(layout):
  """Nearest centroid (targets = inputs) and the released weighted rule (targets
  differ), both against a loop over every weight and centroid."""
  rng = np.random.default_rng(3)
  W = rng.standard_normal((16, 5))
  book = cb.kmeans_group_quant(W, 3, 8, per_output_column=LAYOUTS[layout])
  centroids = book.centroids + 0.05 * rng.standard_normal(book.centroids.shape).astype(np.float32)
  x = rng.standard_normal((40, 16)) * rng.uniform(0.2, 3.0, 16)
  for xt in (x, x + 0.5 * rng.standard_normal(x.shape)):
    indices, kept = cb.recluster(W, centroids, 8, x, xt)
    np.testing.assert_array_equal(kept, centroids)  # the released code keeps them
    np.testing.assert_array_equal(indices, brute_force_recluster(W, centroids, 8, x, xt))
  nearest, _ = cb.recluster(W, centroids, 8)
  np.testing.assert_array_equal(nearest, brute_force_recluster(W, centroids, 8, x, x))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_recluster_never_raises_the_kmeans_objective(layout):
  """From moved centroids (as fine-tuning moves them) with the indices they were
  tuned at: reassignment, then the mean update, each leave sum (w - c[index])^2
  no larger; targets = inputs."""
  rng = np.random.default_rng(4)
  W = rng.standard_normal((16, 6)).astype(np.float32)
  book = cb.kmeans_group_quant(W, 2, 8, per_output_column=LAYOUTS[layout])
  x = rng.standard_normal((64, 16)).astype(np.float32)
  tuned = cb.finetune_centroids(x, W, book.indices, book.centroids, 8, steps=20, lr=5e-2)
  tuned.centroids = tuned.centroids + 0.3 * rng.standard_normal(tuned.centroids.shape)

  def objective(indices, centroids):
    return float(np.sum((np.asarray(cb.decode(indices, centroids, 8), np.float64) - W) ** 2))

  before = objective(book.indices, tuned.centroids)
  assigned, _ = cb.recluster(W, tuned.centroids, 8, x)
  moved, means = cb.recluster(W, tuned.centroids, 8, x, update=True)
  np.testing.assert_array_equal(moved, assigned)
  assert objective(assigned, tuned.centroids) <= before + 1e-9
  assert objective(moved, means) <= objective(assigned, tuned.centroids) + 1e-9
  assert objective(assigned, tuned.centroids) < before  # fine-tuning left some weight off


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sort_book_keeps_w_hat_and_sorts_every_codebook(layout):
  rng = np.random.default_rng(5)
  W = rng.standard_normal((16, 4))
  book = cb.kmeans_group_quant(W, 3, 8, per_output_column=LAYOUTS[layout])
  shuffled = book.centroids[..., rng.permutation(8)]
  indices, centroids = cb.sort_book(book.indices, shuffled, 8)  # names other values now
  np.testing.assert_array_equal(
    cb.decode(indices, centroids, 8), cb.decode(book.indices, shuffled, 8)
  )
  assert np.all(np.diff(centroids, axis=-1) >= 0)
