"""ProbMoE (router 'probmoe'): the conditional-Bernoulli DP against enumeration of all
subsets, exact sampling against the marginals, dynamic-k's law of k, the
straight-through gradient, and the deterministic evaluation rules; marginals at
logits up to +-30, and the two official gradients of the marginals (log q
detached or kept) against the enumerated covariance."""

import functools
import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from moejax.config import base_config
from moejax.routing import call_router, router_config
from moejax.routing import probmoe as pm
from tests.helpers import moe_cfg, random_logits

N_SAMPLES = 50_000


def bernoulli64(logits_row):
  """(p, q) in float64, q = sigmoid(-l) directly (1 - p loses q's digits for l >~ 20)."""
  logit = np.asarray(logits_row, np.float64)
  return 1 / (1 + np.exp(-logit)), 1 / (1 + np.exp(logit))


def enumerate_subsets(logits_row, sizes):
  """Brute force over every subset with |S| in `sizes`: (marginals [n], P(|S| = k) dict)."""
  p, q = bernoulli64(logits_row)
  n = p.shape[0]
  num, mass = np.zeros(n), {}
  for k in sizes:
    mass[k] = 0.0
    for subset in itertools.combinations(range(n), k):
      z = np.zeros(n)
      z[list(subset)] = 1
      w = np.prod(np.where(z == 1, p, q))
      mass[k] += w
      num += w * z
  return num / sum(mass.values()), mass


def route(logits, train, rng=None, **cfg):
  cfg = moe_cfg(router="probmoe", num_experts=logits.shape[1], **cfg)
  fn = functools.partial(call_router, "probmoe", moe=cfg, state={}, train=train)
  return jax.jit(fn)(jnp.asarray(logits), rng=rng)


def test_marginals_equal_enumeration_of_all_56_subsets():
  logits = np.concatenate(
    [random_logits(s, 2, 8, scale=sc) for s, sc in ((0, 0.5), (1, 2.0), (2, 4.0))]
  )

  @jax.jit
  def dp(logit):
    log_p, log_q = pm.bernoulli_log_probs(logit)
    return pm.marginals(log_p, log_q, 3, 3), pm.count_table(log_p, log_q, 3)[-1, :, 3]

  m, log_z = (np.asarray(a) for a in dp(jnp.asarray(logits)))
  for t in range(logits.shape[0]):
    expected, mass = enumerate_subsets(logits[t], [3])
    np.testing.assert_allclose(m[t], expected, atol=1e-5)
    np.testing.assert_allclose(m[t].sum(), 3.0, atol=1e-5)
    np.testing.assert_allclose(log_z[t], np.log(mass[3]), rtol=1e-5)


def test_exact_samples_have_k_ones_and_marginal_frequencies():
  logits = random_logits(3, 1, 8, scale=1.5)
  out = route(np.repeat(logits, N_SAMPLES, 0), True, jax.random.key(0), top_k=3)
  r = out.routing
  idx, valid = np.asarray(r.expert_index), np.asarray(r.valid)
  assert valid.all() and idx.shape == (N_SAMPLES, 3)
  assert all(len(set(row)) == 3 for row in idx[:2000].tolist())  # k distinct experts
  z = np.zeros((N_SAMPLES, 8))
  np.put_along_axis(z, idx, 1.0, 1)
  assert (z.sum(1) == 3).all()
  m, _ = enumerate_subsets(logits[0], [3])
  sigma = np.sqrt(m * (1 - m) / N_SAMPLES)
  assert (np.abs(z.mean(0) - m) < 3 * sigma).all(), (z.mean(0), m)
  # forward weights are softmax at the sampled experts, not renormalised
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))[0]
  np.testing.assert_allclose(np.asarray(r.combine_weight), probs[idx], rtol=1e-6)


def test_dynamic_k_lies_in_band_with_the_dp_law():
  k_min, k_max = 2, 4
  logits = random_logits(5, 1, 8, scale=1.0) - 0.5
  out = route(
    np.repeat(logits, N_SAMPLES, 0),
    True,
    jax.random.key(1),
    top_k=2,
    probmoe=dict(k_min=k_min, k_max=k_max),
  )
  r = out.routing
  assert r.expert_index.shape == (N_SAMPLES, k_max)
  ks = np.asarray(r.valid).sum(1)
  assert ks.min() >= k_min and ks.max() <= k_max
  m, mass = enumerate_subsets(logits[0], range(k_min, k_max + 1))
  law = np.array([mass[k] for k in range(k_min, k_max + 1)])
  law /= law.sum()
  observed = np.bincount(ks - k_min, minlength=k_max - k_min + 1)
  expected = law * N_SAMPLES
  chi2 = np.sum((observed - expected) ** 2 / expected)
  assert chi2 < 13.8, (observed, expected)  # chi-square, 2 dof, p = 0.001
  # band marginals: frequencies within 3 sigma
  z = np.zeros((N_SAMPLES, 8))
  idx, valid = np.asarray(r.expert_index), np.asarray(r.valid)
  for s in range(k_max):
    z[np.arange(N_SAMPLES)[valid[:, s]], idx[valid[:, s], s]] = 1
  sigma = np.sqrt(m * (1 - m) / N_SAMPLES)
  assert (np.abs(z.mean(0) - m) < 3 * sigma).all()
  assert (np.asarray(r.combine_weight)[~valid] == 0).all()
  assert (idx[~valid] == 0).all()


def test_straight_through_gradient():
  """d weights / d logits is that of g * softmax with g = sg(z - m) + m for the sampled z."""
  logits = jnp.asarray(random_logits(7, 4, 6))
  rng = jax.random.key(3)
  c = jnp.asarray(np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32))

  def through_router(logit):
    r = route(logit, True, rng, top_k=2).routing
    return jnp.sum(jnp.take_along_axis(c, r.expert_index, 1) * r.combine_weight)

  z = np.zeros((4, 6), np.float32)
  np.put_along_axis(z, np.asarray(route(logits, True, rng, top_k=2).routing.expert_index), 1.0, 1)

  def surrogate(logit):
    log_p, log_q = pm.bernoulli_log_probs(logit)
    m = pm.marginals(log_p, log_q, 2, 2)
    g = jax.lax.stop_gradient(z - m) + m
    return jnp.sum(c * z * g * jax.nn.softmax(logit, -1))

  got, want = jax.jit(jax.grad(through_router))(logits), jax.jit(jax.grad(surrogate))(logits)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.count_nonzero(np.asarray(got)) > 8  # gradient reaches unselected experts via m


def test_eval_is_deterministic_top_k():
  logits = random_logits(11, 16, 8)
  for renormalize in (True, False):
    routing = {"renormalize": renormalize}
    got = route(logits, False, top_k=3, routing=routing).routing
    want = call_router("topk", jnp.asarray(logits), moe_cfg(top_k=3, routing=routing)).routing
    np.testing.assert_array_equal(got.expert_index, want.expert_index)
    np.testing.assert_allclose(got.combine_weight, want.combine_weight, rtol=1e-6)


def test_dynamic_eval_keeps_prefix_sum_argmax():
  logits = random_logits(12, 32, 8)
  k_min, k_max = 2, 5
  r = route(logits, False, probmoe=dict(k_min=k_min, k_max=k_max)).routing
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))
  for t in range(32):
    order = np.argsort(-logits[t], kind="stable")
    prefix = np.cumsum(logits[t][order])
    k_star = k_min + int(np.argmax(prefix[k_min - 1 : k_max]))
    valid = np.asarray(r.valid[t])
    assert valid.sum() == k_star and valid[:k_star].all()
    np.testing.assert_array_equal(np.asarray(r.expert_index[t])[:k_star], order[:k_star])
    w = probs[t][order[:k_star]]
    np.testing.assert_allclose(np.asarray(r.combine_weight[t])[:k_star], w / w.sum(), rtol=1e-5)


def test_training_without_rng_is_refused():
  with pytest.raises(ValueError, match="rng"):
    route(random_logits(0, 2, 4), True, None)


# ---- large logits (issue 11, bug 2) and the log q gradient variants -------------------------

ISSUE_LOGITS = [20.0, 19.0, 18.0, 17.0, 16.0, -1.0, -2.0, 0.0, 1.0, 2.0]


@functools.lru_cache(maxsize=None)
def dp_marginals(k_min, k_max, detach_log_q=True):
  @jax.jit
  def fn(logit):
    if detach_log_q:  # the default, the one-argument call
      log_p, log_q = pm.bernoulli_log_probs(logit)
    else:
      log_p, log_q = pm.bernoulli_log_probs(logit, detach_log_q=False)
    return pm.marginals(log_p, log_q, k_min, k_max)

  return fn


def test_marginals_at_large_logits_equal_enumeration():
  """The issue's case: log p must not saturate at l ~ 16 (exact marginals 0.988,
  0.968, 0.914, 0.766, 0.364; the clamped log p gave 0.805 x 4, 0.78)."""
  rows = [
    ISSUE_LOGITS,
    [-v for v in ISSUE_LOGITS],
    [30.0, 29.0, 25.0, 22.0, 17.0, 16.5, -30.0, -29.0, -20.0, 0.0],
    [-30.0, -29.5, -28.0, -25.0, -24.0, -22.0, -20.0, -18.0, -16.0, -30.0],
  ]
  logits = np.asarray(rows, np.float32)
  for k_min, k_max in ((4, 4), (1, 1), (3, 6)):
    m = np.asarray(dp_marginals(k_min, k_max)(jnp.asarray(logits)))
    for t in range(len(rows)):
      expected, _ = enumerate_subsets(logits[t], range(k_min, k_max + 1))
      np.testing.assert_allclose(
        m[t], expected, rtol=0, atol=1e-5, err_msg=f"row {t}, k in [{k_min}, {k_max}]"
      )
  m = np.asarray(dp_marginals(4, 4)(jnp.asarray(logits[:1])))[0]
  np.testing.assert_allclose(m[:5], [0.988, 0.968, 0.914, 0.766, 0.364], atol=1e-3)


@settings(max_examples=30)  # each new shape compiles (suite budget)
@given(
  logits=hnp.arrays(np.float32, (3, 8), elements=st.floats(-30, 30, width=32)),
  band=st.sampled_from([(1, 1), (2, 2), (4, 4), (7, 7), (2, 5)]),
)
def test_marginals_equal_enumeration_for_logits_in_pm30(logits, band):
  k_min, k_max = band
  m = np.asarray(dp_marginals(k_min, k_max)(jnp.asarray(logits)))
  for t in range(logits.shape[0]):
    expected, _ = enumerate_subsets(logits[t], range(k_min, k_max + 1))
    np.testing.assert_allclose(m[t], expected, rtol=0, atol=1e-5)


def enumerate_covariance(logits_row, k):
  """Cov(z_i, z_j | sum z = k) [n, n] by brute force, float64."""
  p, q = bernoulli64(logits_row)
  n = p.shape[0]
  zs = []
  ws = []
  for subset in itertools.combinations(range(n), k):
    z = np.zeros(n)
    z[list(subset)] = 1
    zs.append(z)
    ws.append(np.prod(np.where(z == 1, p, q)))
  zs, ws = np.asarray(zs), np.asarray(ws) / np.sum(ws)
  mean = ws @ zs
  return (zs * ws[:, None]).T @ zs - np.outer(mean, mean), q


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_log_q_gradient_variants_differ_by_q_per_expert(scale):
  """Kept log q (OLMoE scripts): dm_i/dl_j = Cov(z_i, z_j | sum z = k), the exponential
  family's identity for the natural parameter l. Detached log q (Qwen scripts, the
  default): the same column scaled by q_j = 1 - sigmoid(l_j)."""
  k = 3
  logits = random_logits(21, 2, 7, scale=scale)
  for t in range(logits.shape[0]):
    cov, q = enumerate_covariance(logits[t], k)
    row = jnp.asarray(logits[t : t + 1])
    kept = np.asarray(jax.jacobian(lambda logit: dp_marginals(k, k, False)(logit)[0])(row))[:, 0]
    detached = np.asarray(jax.jacobian(lambda logit: dp_marginals(k, k, True)(logit)[0])(row))[:, 0]
    np.testing.assert_allclose(kept, cov, rtol=0, atol=2e-6)
    np.testing.assert_allclose(detached, cov * q[None, :], rtol=0, atol=2e-6)
    assert np.abs(kept - detached).max() > 1e-3  # the two variants are distinguishable


def test_straight_through_gradient_follows_the_log_q_option():
  """`model.moe.probmoe.detach_log_q` reaches the router's gradient."""
  logits = jnp.asarray(random_logits(8, 4, 6))
  rng = jax.random.key(5)
  c = jnp.asarray(np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32))
  z = np.zeros((4, 6), np.float32)
  np.put_along_axis(z, np.asarray(route(logits, True, rng, top_k=2).routing.expert_index), 1.0, 1)
  grads = {}
  for detach in (True, False):

    def through_router(logit):
      r = route(logit, True, rng, top_k=2, probmoe=dict(detach_log_q=detach)).routing
      return jnp.sum(jnp.take_along_axis(c, r.expert_index, 1) * r.combine_weight)

    def surrogate(logit):
      log_p, log_q = pm.bernoulli_log_probs(logit, detach)
      m = pm.marginals(log_p, log_q, 2, 2)
      g = jax.lax.stop_gradient(z - m) + m
      return jnp.sum(c * z * g * jax.nn.softmax(logit, -1))

    grads[detach] = np.asarray(jax.jit(jax.grad(through_router))(logits))
    np.testing.assert_allclose(
      grads[detach], jax.jit(jax.grad(surrogate))(logits), rtol=1e-5, atol=1e-6
    )
  assert np.abs(grads[True] - grads[False]).max() > 1e-4


def test_detach_log_q_option_is_validated():
  from moejax.validation import validate_moe
  from moejax.errors import ConfigError

  c = base_config().model.moe
  c.router = "probmoe"
  validate_moe(c, 4)
  c.probmoe.detach_log_q = False
  validate_moe(c, 4)
  c = base_config().model.moe.to_dict()
  c["probmoe"]["detach_log_q"] = "no"
  with pytest.raises(ConfigError, match=r"model\.moe\.probmoe\.detach_log_q='no'"):
    pm.validate_keys(router_config("probmoe", ml_collections.ConfigDict(c)))


def test_stored_flat_probmoe_keys_load_into_model_moe_probmoe():
  """Workdirs and sweep results saved before the section keep loading (and matching)."""
  from moejax.migrate import with_defaults
  from moejax.train.sweep import fingerprint, same_config

  saved = base_config().to_dict()
  moe = saved["model"]["moe"]
  del moe["probmoe"]
  moe.update(probmoe_k_min=1, probmoe_k_max=3, probmoe_detach_log_q=False)
  assert with_defaults(saved)["model"]["moe"]["probmoe"] == {
    "k_min": 1,
    "k_max": 3,
    "detach_log_q": False,
  }
  current = base_config()
  current.model.moe.probmoe.update(dict(k_min=1, k_max=3, detach_log_q=False))
  assert same_config(fingerprint(saved), current)
  current.model.moe.probmoe.k_max = 4
  assert not same_config(fingerprint(saved), current)
