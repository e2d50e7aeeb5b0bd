"""MP-MoE (router 'mahalanobis'): incremental-Cholesky gains against direct linear
solves, the Sigma = I limit, perfectly correlated experts, greedy vs brute force,
and the co-occurrence EMA state."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from moejax.routing import call_router, get_router
from moejax.routing.mahalanobis import batch_cooccurrence_cov, greedy_mahalanobis
from tests.helpers import moe_cfg, random_logits

greedy = jax.jit(greedy_mahalanobis, static_argnums=2)


@functools.lru_cache(maxsize=None)
def jitted_route(name, train, ema_decay=None, **cfg):
  """One compiled router per (name, config); state and logits are arguments.
  ema_decay: model.moe.mahalanobis.ema_decay (None: the default)."""
  if ema_decay is not None:
    cfg["mahalanobis"] = dict(ema_decay=ema_decay)
  cfg = moe_cfg(router=name, **cfg)
  return jax.jit(functools.partial(call_router, name, moe=cfg, rng=None, train=train))


def objective(g, sigma, subset):
  s = list(subset)
  return float(g[s] @ np.linalg.solve(sigma[np.ix_(s, s)], g[s]))


def cooccurrence_sigma(rng, num_experts, k, ridge=1e-3, num_tokens=256):
  """Covariance of the top-k selection indicators of a random router, plus ridge."""
  logits = rng.standard_normal((num_tokens, num_experts)) + rng.standard_normal(num_experts)
  z = np.zeros((num_tokens, num_experts))
  np.put_along_axis(z, np.argsort(-logits, 1)[:, :k], 1.0, 1)
  return np.cov(z.T, bias=True) + ridge * np.eye(num_experts)


def softmax(x):
  z = np.exp(x - x.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


@settings(max_examples=40)
@given(st.integers(0, 2**16))
def test_incremental_gains_equal_direct_recomputation(seed):
  rng = np.random.default_rng(seed)
  e, k = 10, 4
  a = rng.standard_normal((e, e))
  sigma = a @ a.T / e + 0.1 * np.eye(e)  # a generic SPD matrix, not just co-occurrence
  g = softmax(rng.standard_normal((5, e)))
  index, gains = (
    np.asarray(x) for x in greedy(jnp.asarray(g, jnp.float32), jnp.asarray(sigma, jnp.float32), k)
  )
  for t in range(5):
    chosen = []
    for step in range(k):
      base = objective(g[t], sigma, chosen) if chosen else 0.0
      direct = {j: objective(g[t], sigma, chosen + [j]) - base for j in range(e) if j not in chosen}
      np.testing.assert_allclose(gains[t, step], direct[index[t, step]], rtol=2e-3, atol=1e-6)
      assert direct[index[t, step]] >= max(direct.values()) * (1 - 2e-3)  # the argmax
      chosen.append(int(index[t, step]))
    np.testing.assert_allclose(gains[t].sum(), objective(g[t], sigma, chosen), rtol=2e-3)


@settings(max_examples=60)
@given(st.sampled_from([(6, 5, 2), (16, 8, 3)]), st.integers(0, 2**16))
def test_identity_sigma_is_top_k(shape, seed):
  t, e, k = shape
  logits = random_logits(seed, t, e)
  state = get_router("mahalanobis").init_state(e)  # 0: Sigma = ridge * I
  mp = jitted_route("mahalanobis", True, num_experts=e, top_k=k)(
    jnp.asarray(logits), state=state
  ).routing
  tk = jitted_route("topk", True, num_experts=e, top_k=k)(jnp.asarray(logits), state={}).routing
  np.testing.assert_array_equal(mp.expert_index, tk.expert_index)
  np.testing.assert_allclose(mp.combine_weight, tk.combine_weight, rtol=1e-6)


def test_perfectly_correlated_experts_only_one_chosen():
  rng = np.random.default_rng(0)
  e, k = 6, 2
  z = (rng.random((400, e)) < 0.4).astype(float)
  z[:, 1] = z[:, 0]  # experts 0 and 1 always co-occur
  # The duplicate's gain is O(ridge): a small ridge makes "never" hold for every token.
  sigma = np.cov(z.T, bias=True) + 1e-5 * np.eye(e)
  logits = rng.standard_normal((32, e)) - 1.0
  logits[:, 1] = logits[:, 0] = 2.0  # duplicates get the same (highest) score
  g = softmax(logits)
  index = np.asarray(greedy(jnp.asarray(g, jnp.float32), jnp.asarray(sigma, jnp.float32), k)[0])
  assert ((index == 0) | (index == 1)).sum(1).tolist() == [1] * 32
  assert np.all(np.isin(np.argsort(-g, 1)[:, :2], [0, 1]))  # plain top-k takes both


def test_greedy_within_063_of_brute_force():
  rng = np.random.default_rng(0)
  e, k = 10, 3
  worst = 1.0
  for _ in range(25):
    sigma = cooccurrence_sigma(rng, e, k)
    g = softmax(rng.standard_normal((4, e)))
    index = np.asarray(greedy(jnp.asarray(g, jnp.float32), jnp.asarray(sigma, jnp.float32), k)[0])
    for t in range(4):
      best = max(objective(g[t], sigma, s) for s in itertools.combinations(range(e), k))
      worst = min(worst, objective(g[t], sigma, index[t]) / best)
  assert worst >= 0.63, worst


def test_cooccurrence_ema_state_and_inference_top_k():
  e, k, decay = 6, 2, 0.9
  logits = random_logits(3, 40, e)
  cfg = dict(num_experts=e, top_k=k, ema_decay=decay)
  old = np.random.default_rng(1).random((e, e)).astype(np.float32)
  old = old @ old.T / e
  out = jitted_route("mahalanobis", True, **cfg)(
    jnp.asarray(logits), state={"cooc_cov": jnp.asarray(old)}
  )
  z = np.zeros((40, e))
  np.put_along_axis(z, np.asarray(out.routing.expert_index), 1.0, 1)
  np.testing.assert_allclose(
    out.state["cooc_cov"], decay * old + (1 - decay) * np.cov(z.T, bias=True), rtol=1e-5, atol=1e-7
  )
  np.testing.assert_allclose(
    batch_cooccurrence_cov(out.routing, e), np.cov(z.T, bias=True), atol=1e-6
  )
  ev = jitted_route("mahalanobis", False, **cfg)(
    jnp.asarray(logits), state={"cooc_cov": jnp.asarray(old)}
  )
  np.testing.assert_array_equal(ev.state["cooc_cov"], old)
  tk = jitted_route("topk", False, **cfg)(jnp.asarray(logits), state={})
  np.testing.assert_array_equal(ev.routing.expert_index, tk.routing.expert_index)
