"""Capacity-aware Token Drop / Expanded Drop (router 'capacity_aware') against a
numpy brute force of the released algorithm: gamma -> infinity is top-k, loads never
exceed C, each expert keeps its top-C tokens by score, expanded candidates, r = 1
is Token Drop, and per-shard capacity."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from moejax.routing import call_router
from moejax.routing.capacity_aware import capacity_route, num_candidates, token_capacity
from tests.helpers import moe_cfg, random_logits

CASES = settings(max_examples=25)
# (T, E, k): few shapes (each compiles), many contents
shapes = st.tuples(st.sampled_from([(24, 6, 2), (40, 8, 3), (9, 4, 1)]), st.integers(0, 2**16))


def router(**cfg):
  """The registered router for a config (eager)."""
  cfg = moe_cfg(router="capacity_aware", **cfg)
  return functools.partial(call_router, "capacity_aware", moe=cfg)


# Capacity and candidate count traced: one compile per shape, whatever gamma and r.
core = jax.jit(capacity_route, static_argnames=("top_k", "num_shards", "renormalize"))


def route(logits, k, gamma, expand_r=1.0, shards=0):
  """The router's computation for (gamma, r), with C and ceil(k r) as the router sets them."""
  t, e = logits.shape
  return core(
    jax.nn.softmax(jnp.asarray(logits), -1),
    top_k=k,
    capacity=token_capacity(t, shards or e, k, gamma),
    num_cand=num_candidates(e, k, expand_r),
    num_shards=shards,
  )


def softmax(x):
  z = np.exp(x - x.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def brute_force(probs, k, gamma, r=1.0, shards=0):
  """The released algorithm, one (token, expert) pair at a time: {(t, e)} kept."""
  t_, e_ = probs.shape
  n_cand = min(e_, max(k, math.ceil(k * r)))
  cand = {(t, int(e)) for t in range(t_) for e in np.argsort(-probs[t], kind="stable")[:n_cand]}
  if t_ > 1:
    groups = shards if shards else e_
    cap = max(1, math.ceil(gamma * k * t_ / groups))
    per = e_ // groups
    kept = set()
    for grp in range(groups):
      pairs = sorted((p for p in cand if p[1] // per == grp), key=lambda p: (-probs[p], p[0], p[1]))
      kept |= set(pairs[:cap])
  else:
    kept = cand
  final = set()
  for t in range(t_):
    mine = sorted((e for (tt, e) in kept if tt == t), key=lambda e: -probs[t, e])
    final |= {(t, e) for e in mine[:k]}
  return final


def kept_pairs(routing):
  idx, valid = np.asarray(routing.expert_index), np.asarray(routing.valid)
  return {(int(t), int(idx[t, s])) for t, s in zip(*np.nonzero(valid))}


@CASES
@given(shapes, st.booleans())
def test_gamma_to_infinity_is_top_k(shape, renormalize):
  (t, e, k), seed = shape
  logits = random_logits(seed, t, e)
  got = core(
    jax.nn.softmax(jnp.asarray(logits), -1),
    top_k=k,
    capacity=token_capacity(t, e, k, 1e6),
    num_cand=k,
    renormalize=renormalize,
  )
  probs = softmax(logits.astype(np.float64))
  index = np.argsort(-probs, 1, kind="stable")[:, :k]
  weight = np.take_along_axis(probs, index, 1)
  if renormalize:
    weight = weight / weight.sum(1, keepdims=True)
  assert bool(jnp.all(got.valid))
  np.testing.assert_array_equal(got.expert_index, index)
  np.testing.assert_allclose(got.combine_weight, weight, rtol=2e-6)


@CASES
@given(shapes, st.sampled_from([0.25, 0.5, 1.0, 1.5]))
def test_token_drop_keeps_each_experts_top_c(shape, gamma):
  (t, e, k), seed = shape
  logits = random_logits(seed, t, e)
  r = route(logits, k, gamma)
  probs = softmax(logits.astype(np.float64))
  cap = max(1, math.ceil(gamma * k * t / e))
  kept = kept_pairs(r)
  loads = np.bincount([p[1] for p in kept], minlength=e)
  assert loads.max() <= cap
  topk = np.argsort(-probs, 1, kind="stable")[:, :k]
  for j in range(e):  # the kept set is the top-C by score among the tokens routed to j
    routed = [i for i in range(t) if j in topk[i]]
    expected = set(sorted(routed, key=lambda i: -probs[i, j])[:cap])
    assert {i for (i, jj) in kept if jj == j} == expected
  assert kept == brute_force(probs, k, gamma)
  w, valid = np.asarray(r.combine_weight), np.asarray(r.valid)
  assert w.dtype == np.float32 and (w >= 0).all() and (w[~valid] == 0).all()
  sums = w.sum(1)
  np.testing.assert_allclose(sums[valid.any(1)], 1.0, rtol=1e-5)  # renormalised over kept


@CASES
@given(shapes, st.sampled_from([0.5, 1.0]), st.sampled_from([1.5, 2.0, 3.0]))
def test_expanded_drop_matches_brute_force(shape, gamma, expand_r):
  (t, e, k), seed = shape
  logits = random_logits(seed, t, e)
  r = route(logits, k, gamma, expand_r)
  probs = softmax(logits.astype(np.float64))
  kept = kept_pairs(r)
  assert kept == brute_force(probs, k, gamma, expand_r)
  n_cand = min(e, max(k, math.ceil(k * expand_r)))
  cand = np.argsort(-probs, 1, kind="stable")[:, :n_cand]
  assert all(j in cand[i] for i, j in kept)
  assert np.asarray(r.valid).sum(1).max() <= k
  cap = max(1, math.ceil(gamma * k * t / e))
  assert np.bincount([p[1] for p in kept], minlength=e).max() <= cap
  # r = 1 is Token Drop: the same as the brute-force Token Drop. (Expanding can
  # keep fewer pairs in total: over-selected candidates use capacity that their
  # token then does not need.)
  r1 = route(logits, k, gamma, 1.0)
  assert kept_pairs(r1) == brute_force(probs, k, gamma)


@CASES
@given(shapes, st.sampled_from([0.5, 1.0]), st.sampled_from([1.0, 2.0]))
def test_per_shard_capacity(shape, gamma, expand_r):
  (t, e, k), seed = shape
  shards = 2
  logits = random_logits(seed, t, e)
  r = route(logits, k, gamma, expand_r, shards)
  probs = softmax(logits.astype(np.float64))
  kept = kept_pairs(r)
  assert kept == brute_force(probs, k, gamma, expand_r, shards)
  cap = max(1, math.ceil(gamma * k * t / shards))
  loads = np.bincount([p[1] // (e // shards) for p in kept], minlength=shards)
  assert loads.max() <= cap


def test_registered_router_matches_brute_force():
  """The config path: gamma, r and shards from model.moe, against the brute force."""
  logits = random_logits(5, 40, 8)
  probs = softmax(logits.astype(np.float64))
  for gamma, r, shards in ((0.5, 1.0, 0), (0.75, 2.0, 0), (0.5, 1.5, 4)):
    out = router(
      num_experts=8, top_k=2, capacity_aware=dict(gamma=gamma, expand_r=r, num_shards=shards)
    )(jnp.asarray(logits))
    assert kept_pairs(out.routing) == brute_force(probs, 2, gamma, r, shards)
    dropped = 1 - np.asarray(out.routing.valid).mean()
    np.testing.assert_allclose(float(out.metrics["router_dropped_fraction"]), dropped, atol=1e-6)


def test_single_token_is_never_dropped():
  logits = random_logits(0, 1, 8)
  r = router(num_experts=8, top_k=2, capacity_aware=dict(gamma=0.01))(jnp.asarray(logits)).routing
  assert bool(jnp.all(r.valid))


def test_weights_match_the_official_masked_logits_path():
  """The official patch (logits path) sets dropped experts' logits to finfo.min and the
  host model's softmax renormalises over the kept experts: renormalize=True gives those
  weights; renormalize=False gives raw P at the kept experts (the (indices, weights)
  path without norm_topk_prob)."""
  logits = random_logits(7, 40, 8)
  probs = softmax(logits.astype(np.float64))
  kwargs = dict(num_experts=8, top_k=2, capacity_aware=dict(gamma=0.5))
  renorm = router(**kwargs, routing={"renormalize": True})(jnp.asarray(logits)).routing
  raw = router(**kwargs, routing={"renormalize": False})(jnp.asarray(logits)).routing
  kept = kept_pairs(renorm)
  assert kept == kept_pairs(raw) and len(kept) < 40 * 2  # some pairs were dropped
  masked = np.full(logits.shape, np.finfo(np.float32).min, np.float64)
  for t, e in kept:
    masked[t, e] = logits[t, e]
  host = softmax(masked)
  for routing, expected in ((renorm, host), (raw, probs)):
    idx, w, valid = (
      np.asarray(a) for a in (routing.expert_index, routing.combine_weight, routing.valid)
    )
    got = {(int(t), int(idx[t, s])): float(w[t, s]) for t, s in zip(*np.nonzero(valid))}
    np.testing.assert_allclose(
      [got[p] for p in sorted(kept)], [expected[p] for p in sorted(kept)], rtol=1e-5
    )
