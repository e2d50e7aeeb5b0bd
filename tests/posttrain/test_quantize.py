"""RTN and GPTQ weight quantizers (moejax/posttrain/quantize.py) against the
half-step bound, a naive OBS loop with an explicit inverse per step, and RTN."""

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.posttrain import quantize as qz


def random_weight(seed, d_in=64, d_out=32):
  """Rows of very different magnitude, so groups get different scales."""
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(d_in, d_out)) * rng.uniform(0.1, 3.0, size=(d_in, 1))).astype(np.float32)


def correlated_inputs(seed, n=256, d_in=64):
  """X = Z A with a decaying spectrum and a shared direction: strongly correlated."""
  rng = np.random.default_rng(seed + 100)
  mixing = rng.normal(size=(d_in, d_in)) * (0.9 ** np.arange(d_in) * 3)[:, None]
  shared = rng.normal(size=(n, 1)) * rng.normal(size=(1, d_in))
  return (
    rng.normal(size=(n, d_in)) @ mixing + 2 * shared + 0.05 * rng.normal(size=(n, d_in))
  ).astype(np.float32)


@pytest.mark.parametrize("symmetric", [False, True])
def test_eight_bit_round_trip_is_within_half_a_step(symmetric):
  W = random_weight(0)
  q = qz.rtn(W, 8, 16, symmetric=symmetric)
  assert q.codes.dtype == (np.int8 if symmetric else np.uint8)
  assert q.codes.shape == W.shape and q.scales.shape == (4, 32)
  step = np.repeat(q.scales, 16, axis=0)
  error = np.abs(W - qz.dequantize(q))
  assert np.all(error <= step / 2 * (1 + 1e-5) + 1e-7), (error / step).max()
  groups = W.reshape(4, 16, 32)
  if symmetric:  # the grid is tight: absmax / 127
    np.testing.assert_allclose(q.scales, np.abs(groups).max(1) / 127, rtol=1e-6)
    assert np.all(np.abs(q.codes.reshape(4, 16, 32)).max(1) == 127)
  else:  # range [min(w, 0), max(w, 0)] over 255 steps
    span = np.maximum(groups.max(1), 0) - np.minimum(groups.min(1), 0)
    np.testing.assert_allclose(q.scales, span / 255, rtol=1e-6)
  print(f"8-bit {'sym' if symmetric else 'asym'}: max |error| / step = {(error / step).max():.4f}")


def naive_obs(W, H, bits, group_size, damp=0.01, symmetric=False):
  """GPTQ's update done the OBS way (Frantar et al. eq. 2-3): invert H over the
  rows still to quantize at every step; w_F -= (w_i - q_i) / [H_F^-1]_ii [H_F^-1]_{:,i}."""
  W = np.array(W, np.float64)
  H = np.array(H, np.float64)
  H[np.diag_indices(len(H))] += damp * np.mean(np.diag(H))
  d_in, _ = W.shape
  out = np.empty_like(W)
  for i in range(d_in):
    if i % group_size == 0:
      params = qz._group_params(W[i : i + group_size], bits, symmetric)
    out[i] = qz._values(qz._codes(W[i], *params, bits), *params)
    inverse = np.linalg.inv(H[i:, i:])
    W[i:] -= np.outer(inverse[:, 0], (W[i] - out[i]) / inverse[0, 0])
  return out


@pytest.mark.parametrize("symmetric", [False, True])
def test_gptq_equals_the_naive_obs_loop(symmetric):
  W = random_weight(1, d_in=32, d_out=8)
  H = qz.input_hessian(correlated_inputs(1, n=128, d_in=32))
  for block_size in (1, 8, 128):
    q = qz.gptq(W, H, 3, 8, block_size=block_size, symmetric=symmetric)
    np.testing.assert_allclose(
      qz.dequantize(q), naive_obs(W, H, 3, 8, symmetric=symmetric), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("symmetric", [False, True])
def test_gptq_stack_equals_the_naive_obs_loop_of_each_matrix_with_its_own_hessian(symmetric):
  Ws = np.stack([random_weight(s, d_in=32, d_out=8) for s in range(3)])
  Hs = np.stack([qz.input_hessian(correlated_inputs(s, n=128, d_in=32)) for s in range(3)])
  for block_size in (8, 128):
    stacked = qz.gptq_stack(Ws, Hs, 3, 8, block_size=block_size, symmetric=symmetric)
    for W, H, q in zip(Ws, Hs, stacked):
      np.testing.assert_allclose(
        qz.dequantize(q), naive_obs(W, H, 3, 8, symmetric=symmetric), rtol=1e-6, atol=1e-6
      )


@pytest.mark.parametrize("bits", [3, 4])
def test_gptq_layer_error_is_at_most_rtns_on_correlated_inputs(bits):
  ratios = []
  for seed in range(4):
    W, X = random_weight(seed), correlated_inputs(seed)
    rtn_error = qz.layer_error(W, qz.rtn(W, bits, 16), X)
    gptq_error = qz.layer_error(W, qz.gptq(W, qz.input_hessian(X), bits, 16), X)
    direct = np.sum(
      (X.astype(np.float64) @ W - X.astype(np.float64) @ qz.dequantize(qz.rtn(W, bits, 16))) ** 2
    )
    np.testing.assert_allclose(rtn_error, direct, rtol=1e-9)
    assert gptq_error <= rtn_error, (seed, gptq_error, rtn_error)
    ratios.append(gptq_error / rtn_error)
  print(f"{bits}-bit GPTQ / RTN layer error per seed: " + ", ".join(f"{r:.3f}" for r in ratios))
  assert np.mean(ratios) < 0.8


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gptq_with_identity_hessian_is_rtn(bits, symmetric):
  W = random_weight(2)
  a = qz.gptq(W, np.eye(64), bits, 16, symmetric=symmetric)
  b = qz.rtn(W, bits, 16, symmetric=symmetric)
  np.testing.assert_array_equal(a.codes, b.codes)
  np.testing.assert_array_equal(a.scales, b.scales)
  if not symmetric:
    np.testing.assert_array_equal(a.zero, b.zero)


def test_gptq_zeroes_a_dead_input():
  W, X = random_weight(3), correlated_inputs(3)
  X[:, 5] = 0.0
  q = qz.gptq(W, qz.input_hessian(X), 4, 16)
  W_hat = qz.dequantize(q)
  assert np.all(np.isfinite(W_hat)) and np.all(W_hat[5] == 0.0)


def test_refusals_name_the_value():
  W = random_weight(0)
  for bits in (1, 5, 16):
    with pytest.raises(ConfigError, match=f"bits={bits}"):
      qz.rtn(W, bits, 16)
    with pytest.raises(ConfigError, match=f"bits={bits}"):
      qz.gptq(W, np.eye(64), bits, 16)
  for group_size in (24, 0, 128):
    with pytest.raises(ConfigError, match=f"group_size={group_size}.*d_in=64"):
      qz.rtn(W, 4, group_size)
    with pytest.raises(ConfigError, match=f"group_size={group_size}.*d_in=64"):
      qz.gptq(W, np.eye(64), 4, group_size)
  with pytest.raises(ConfigError, match=r"\(32, 32\)"):
    qz.gptq(W, np.eye(32), 4, 16)


def asymmetric_by_hand(w_col, bits):
  """The module doc's asymmetric grid of one group column, written out."""
  low, high = min(w_col.min(), 0.0), max(w_col.max(), 0.0)
  scale = np.float64(np.float32((high - low) / (2**bits - 1)))
  zero = np.round(-low / scale)
  codes = np.clip(np.round(w_col / scale) + zero, 0, 2**bits - 1)
  return (codes - zero) * scale


def test_the_defaults_are_the_asymmetric_grid_of_the_gptq_reference():
  """No argument given: rtn, gptq, gptq_stack and GEMQ's candidates use the
  asymmetric grid (range [min(w, 0), max(w, 0)]) of the module doc. An all-positive
  column tells the grids apart: the symmetric one wastes its negative half."""
  rng = np.random.default_rng(5)
  W = rng.uniform(0.2, 1.0, size=(12, 5)).astype(np.float32)  # d_in 12, d_out 5, groups of 4
  expected = np.concatenate(
    [
      np.stack([asymmetric_by_hand(W[g : g + 4, j].astype(np.float64), 3) for j in range(5)], 1)
      for g in range(0, 12, 4)
    ]
  )
  np.testing.assert_allclose(qz.dequantize(qz.rtn(W, 3, 4)), expected, rtol=1e-6)
  assert not np.allclose(qz.dequantize(qz.rtn(W, 3, 4, symmetric=True)), expected)
  identity = np.eye(12)  # GPTQ with H = I is RTN (module doc)
  np.testing.assert_allclose(
    qz.dequantize(qz.gptq(W, identity, 3, 4, damp=0.0)), expected, rtol=1e-6
  )
  stacked = qz.gptq_stack(np.stack([W, 2 * W]), np.stack([identity, identity]), 3, 4, damp=0.0)
  np.testing.assert_allclose(qz.dequantize(stacked[0]), expected, rtol=1e-6)
  assert stacked[0].codes.dtype == np.uint8


def test_layer_error_by_hand():
  """||X W - X Wq||_F^2 on a 3 x 2 by 2 x 1 case: X (W - Wq) = [1, -2, -1] -> 6."""
  X = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 2.0]])
  W = np.array([[1.0], [-1.0]])
  Wq = np.array([[0.0], [0.0]])
  assert qz.layer_error(W, Wq, X) == 1 + 4 + 1
  assert qz.layer_error(W, Wq, X[None]) == 6  # any leading axes are tokens
  W2 = np.array([[3.0], [-2.5]])  # X (W2 - Wq) = [3, -5, -2]
  assert qz.layer_error(W2, Wq, X) == 9 + 25 + 4
