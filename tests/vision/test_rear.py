"""Oracles for FlyPrompt's router and heads (moejax/continual/rear.py): the online REAR
statistics give batch ridge (solved by least squares on the stacked system) for any
order and chunking of the rows; M = 0 is linear ridge on the feature; the EMA heads
equal their unrolled closed form; the max of softmaxes on hand values; one-line
refusals naming the key."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.continual.rear import (
  EMAHeadBank,
  RandomExpandedRidgeRouter,
  matched_ridge,
  max_of_softmaxes,
)
from moejax.errors import ConfigError

D, E = 5, 3


def rows(n, seed=0):
  rng = np.random.default_rng(seed)
  return rng.standard_normal((n, D)), rng.integers(0, E, n)


def batch_ridge(h, experts, ridge):
  """argmin_W |H W - Y|^2 + gamma |W|^2 by least squares on [H; sqrt(gamma) I] W = [Y; 0]."""
  m = h.shape[1]
  a = np.concatenate([h, np.sqrt(ridge) * np.eye(m)])
  b = np.concatenate([np.eye(E)[experts], np.zeros((m, E))])
  return np.linalg.lstsq(a, b, rcond=None)[0]


@settings(max_examples=40)
@given(
  n=st.integers(1, 30),
  width=st.sampled_from([0, 4, 17]),
  ridge=st.sampled_from([0.5, 3.0, 1e2]),
  data=st.data(),
)
def test_the_online_router_is_batch_ridge_on_all_rows_in_any_order_and_chunking(
  n, width, ridge, data
):
  f, experts = rows(n, seed=n)
  router = RandomExpandedRidgeRouter(D, width, ridge, E, seed=1)
  state = router.init()
  order = data.draw(st.permutations(range(n)))
  cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=5)))
  for lo, hi in zip([0, *cuts], [*cuts, n]):
    chunk = np.asarray(order[lo:hi], int)
    state = router.collect(state, f[chunk], experts[chunk])
  # the expansion written out: ReLU of f times the router's fixed Gaussian, or f itself
  h = f if width == 0 else np.maximum(f @ state.w_rand, 0)
  want = batch_ridge(h, experts, ridge)
  got = router.solve(state)
  np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)
  test = rows(7, seed=99)[0]
  test_h = test if width == 0 else np.maximum(test @ state.w_rand, 0)
  np.testing.assert_allclose(router.scores(state, got, test), test_h @ want, rtol=1e-9, atol=1e-11)


def test_width_zero_is_linear_ridge_on_the_feature_and_the_expansion_is_a_fixed_gaussian():
  f, experts = rows(40)
  ridge = 2.5
  router = RandomExpandedRidgeRouter(D, 0, ridge, E)
  state = router.collect(router.init(), f, experts)
  assert state.w_rand.shape == (D, 0)
  np.testing.assert_array_equal(router.expand(state, f), f)
  y = np.eye(E)[experts]
  want = np.linalg.solve(f.T @ f + ridge * np.eye(D), f.T @ y)  # the normal equations
  np.testing.assert_allclose(router.solve(state), want, rtol=1e-12, atol=1e-14)
  np.testing.assert_array_equal(router.route(state, want, f), np.argmax(f @ want, -1))
  wide = RandomExpandedRidgeRouter(D, 6, ridge, E, seed=3).init()
  np.testing.assert_array_equal(wide.w_rand, np.random.default_rng(3).standard_normal((D, 6)))


def test_the_matched_ridge_scales_gamma_by_the_mean_diagonal_of_each_gram():
  f, experts = rows(20)
  plain, wide = RandomExpandedRidgeRouter(D, 0, 7.0, E), RandomExpandedRidgeRouter(D, 9, 7.0, E)
  plain_state = plain.collect(plain.init(), f, experts)
  wide_state = wide.collect(wide.init(), f, experts)
  h = np.maximum(f @ wide_state.w_rand, 0)
  # mean diagonal of G: the mean over features of the sum over rows of the squares
  want = 7.0 * (np.sum(f**2) / D) / (np.sum(h**2) / 9)
  got = matched_ridge(7.0, plain, plain_state, wide, wide_state)
  assert got == pytest.approx(want, rel=1e-12)
  assert matched_ridge(7.0, plain, plain_state, wide, wide.init()) == 7.0  # nothing collected


def test_routing_sees_only_the_experts_collected_so_far():
  f, _ = rows(10)
  router = RandomExpandedRidgeRouter(D, 64, 1.0, E)  # no row with h = 0
  state = router.collect(router.init(), f, np.zeros(10, int))
  weights = router.solve(state)
  weights[:, 2] = 1e6  # an expert not collected yet would win every row
  assert set(router.route(state, weights, f).tolist()) == {2}
  assert set(router.route(state, weights, f, seen=1).tolist()) == {0}


def test_the_ema_heads_equal_the_unrolled_closed_form_and_other_experts_stay():
  rng = np.random.default_rng(0)
  decays = (0.9, 0.99, 0.0)
  bank_spec = EMAHeadBank(3, decays)
  theta = rng.standard_normal((12, 4, 6)).astype(np.float32)  # online head per step
  beta = rng.standard_normal((12, 6)).astype(np.float32)
  bank = bank_spec.init(rng.standard_normal((4, 6)), rng.standard_normal(6))
  before = bank.kernel.copy(), bank.bias.copy()
  bank = bank_spec.start(bank, 1, theta[0], beta[0])
  for k in range(1, 12):
    bank = bank_spec.update(bank, 1, theta[k], beta[k])
  n = 11
  for i, r in enumerate(decays):
    kernel = r**n * theta[0].astype(np.float64)
    bias = r**n * beta[0].astype(np.float64)
    for k in range(1, n + 1):
      kernel = kernel + (1 - r) * r ** (n - k) * theta[k]
      bias = bias + (1 - r) * r ** (n - k) * beta[k]
    np.testing.assert_allclose(bank.kernel[1, i], kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bank.bias[1, i], bias, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(bank.kernel[1, 2], theta[n])  # decay 0: the online head
  for e in (0, 2):
    np.testing.assert_array_equal(bank.kernel[e], before[0][e])
    np.testing.assert_array_equal(bank.bias[e], before[1][e])


def test_the_ema_logits_use_each_rows_expert():
  rng = np.random.default_rng(1)
  spec = EMAHeadBank(3, (0.5, 0.9))
  bank = spec.init(np.zeros((4, 5)), np.zeros(5))
  bank = bank._replace(
    kernel=rng.standard_normal(bank.kernel.shape).astype(np.float32),
    bias=rng.standard_normal(bank.bias.shape).astype(np.float32),
  )
  f = rng.standard_normal((4, 4)).astype(np.float32)
  experts = np.array([2, 0, 2, 1])
  got = spec.logits(bank, experts, f)
  for r in range(2):
    for b in range(4):
      want = f[b] @ bank.kernel[experts[b], r] + bank.bias[experts[b], r]
      np.testing.assert_allclose(got[r, b], want, rtol=1e-5, atol=1e-6)


def test_the_heads_combine_by_the_max_of_their_softmaxes():
  logits = np.log([[[1.0, 3.0], [2.0, 2.0]], [[4.0, 1.0], [1.0, 1.0]]])  # [heads, B, C]
  # head 0: [1/4, 3/4], [1/2, 1/2]; head 1: [4/5, 1/5], [1/2, 1/2]
  np.testing.assert_allclose(max_of_softmaxes(logits), [[0.8, 0.75], [0.5, 0.5]], rtol=1e-12)
  masked = np.array([[[0.0, -1e9, 1.0]]])
  np.testing.assert_allclose(
    max_of_softmaxes(masked)[0], [1 / (1 + np.e), 0.0, np.e / (1 + np.e)], rtol=1e-12
  )


@pytest.mark.parametrize(
  "build, names",
  [
    (lambda: RandomExpandedRidgeRouter(D, 4, -1.0, E), ["router.ridge=-1.0", ">= 0"]),
    (lambda: RandomExpandedRidgeRouter(D, -1, 1.0, E), ["router.width=-1", ">= 0"]),
    (lambda: RandomExpandedRidgeRouter(D, 2.5, 1.0, E), ["router.width=2.5"]),
    (lambda: RandomExpandedRidgeRouter(0, 4, 1.0, E), ["router.features=0"]),
    (lambda: EMAHeadBank(2, (0.9, 1.0)), ["te2.decays[1]=1.0", "[0.0, 1.0)"]),
    (lambda: EMAHeadBank(2, (-0.1,)), ["te2.decays[0]=-0.1"]),
    (lambda: EMAHeadBank(2, ()), ["te2.decays=()"]),
  ],
)
def test_bad_settings_are_refused_in_one_line_naming_the_key(build, names):
  with pytest.raises(ConfigError) as error:
    build()
  message = str(error.value)
  assert "\n" not in message and all(name in message for name in names), message


def test_bad_rows_are_refused_naming_the_router():
  router = RandomExpandedRidgeRouter(D, 4, 1.0, E)
  state = router.init()
  with pytest.raises(ConfigError, match=r"router: experts \[0, 3\]"):
    router.collect(state, rows(2)[0], np.array([0, 3]))
  with pytest.raises(ConfigError, match=r"router: features of shape \(2, 4\)"):
    router.collect(state, np.zeros((2, 4)), np.array([0, 1]))
