"""SERE (router 'sere', moejax.analysis.expert_similarity): linear CKA against a
Gram-matrix numpy oracle, re-routing against a numpy brute force, the
no-op cases, fewer distinct experts, and duplicated experts giving identical
layer outputs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moejax.analysis.expert_similarity import linear_cka_matrix
from moejax.dispatch import get_dispatcher
from moejax.experts import swiglu_experts
from moejax.models.capture import expert_outputs_on_tokens
from moejax.routing import Routing, call_router, get_router
from moejax.routing.sere import sere_reroute
from tests.helpers import moe_cfg, random_logits

CASES = settings(max_examples=30)  # each new shape compiles (suite budget)
shapes = st.tuples(st.sampled_from([(12, 8, 3), (6, 6, 2)]), st.integers(0, 2**16))
reroute = jax.jit(sere_reroute, static_argnums=2)


def top_k_routing(logits, k):
  cfg = moe_cfg(num_experts=logits.shape[1], top_k=k)
  return call_router("topk", jnp.asarray(logits), cfg).routing


def random_similarity(rng, e):
  s = rng.random((e, e))
  s = (s + s.T) / 2
  np.fill_diagonal(s, 1.0)
  return s.astype(np.float32)


def pairs(routing):
  """{(token, expert): total weight} over valid slots."""
  idx, w, valid = (
    np.asarray(a) for a in (routing.expert_index, routing.combine_weight, routing.valid)
  )
  out = {}
  for t, s in zip(*np.nonzero(valid)):
    out[(int(t), int(idx[t, s]))] = out.get((int(t), int(idx[t, s])), 0.0) + float(w[t, s])
  return out


def brute_force(routing, sim, s, rho):
  idx, w = np.asarray(routing.expert_index), np.asarray(routing.combine_weight)
  order = np.argsort(-w, axis=1, kind="stable")
  primary = {int(idx[t, j]) for t in range(idx.shape[0]) for j in order[t, :s]}
  out = {}
  for t in range(idx.shape[0]):
    for j in range(idx.shape[1]):
      e = int(idx[t, j])
      if j not in order[t, :s] and e not in primary:
        best = max(primary, key=lambda p: (sim[e, p], -p))
        if sim[e, best] >= rho:
          e = best
      out[(t, e)] = out.get((t, e), 0.0) + float(w[t, j])
  return out


def test_linear_cka_matches_gram_formula_and_invariances():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((4, 30, 5))
  x[2] = x[0] @ np.linalg.qr(rng.standard_normal((5, 5)))[0] * 3.0  # rotated + scaled
  cka = np.asarray(linear_cka_matrix(jnp.asarray(x, jnp.float32)))
  h = np.eye(30) - 1 / 30

  def hsic(a, b):
    return np.trace(a @ a.T @ h @ b @ b.T @ h)

  for a in range(4):
    for b in range(4):
      want = hsic(x[a], x[b]) / np.sqrt(hsic(x[a], x[a]) * hsic(x[b], x[b]))
      np.testing.assert_allclose(cka[a, b], want, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(cka[0, 2], 1.0, rtol=1e-5)
  np.testing.assert_allclose(np.diag(cka), 1.0, rtol=1e-5)


@CASES
@given(shapes, st.integers(1, 2), st.floats(0.0, 1.0))
def test_reroute_matches_brute_force(shape, s, rho):
  (t, e, k), seed = shape
  routing = top_k_routing(random_logits(seed, t, e), k)
  sim = random_similarity(np.random.default_rng(seed), e)
  out = reroute(routing, jnp.asarray(sim), s, rho)
  got, want = pairs(out), brute_force(routing, sim, s, rho)
  assert got.keys() == want.keys()
  np.testing.assert_allclose([got[p] for p in want], list(want.values()), rtol=1e-6)
  # never more distinct experts; every token's total weight is preserved
  before = set(np.asarray(routing.expert_index).ravel().tolist())
  after = {p[1] for p in got}
  assert after <= before
  np.testing.assert_allclose(
    np.asarray(out.masked_weight()).sum(1), np.asarray(routing.combine_weight).sum(1), rtol=1e-6
  )
  idx = np.asarray(out.expert_index)[np.asarray(out.valid)]
  assert ((idx >= 0) & (idx < e)).all() and (np.asarray(out.combine_weight) >= 0).all()


@CASES
@given(shapes, st.integers(1, 2))
def test_identity_or_high_rho_leaves_routing_unchanged(shape, s):
  (t, e, k), seed = shape
  routing = top_k_routing(random_logits(seed, t, e), k)
  sim = random_similarity(np.random.default_rng(seed), e)
  off = sim[~np.eye(e, dtype=bool)].max()
  for similarity, rho in ((np.eye(e, dtype=np.float32), 0.01), (sim, float(off) + 1e-3)):
    out = reroute(routing, jnp.asarray(similarity), s, rho)
    np.testing.assert_array_equal(out.expert_index, routing.expert_index)
    np.testing.assert_array_equal(out.combine_weight, routing.combine_weight)
    np.testing.assert_array_equal(out.valid, routing.valid)


def test_duplicated_experts_give_identical_outputs():
  e, k, d, f = 6, 2, 8, 12
  rng = np.random.default_rng(0)
  w = {
    n: (rng.standard_normal(s) / np.sqrt(s[-2])).astype(np.float32)
    for n, s in (("w_gate", (e, d, f)), ("w_up", (e, d, f)), ("w_down", (e, f, d)))
  }
  for name in w:  # expert 4 duplicates expert 1, expert 5 duplicates expert 0
    w[name][4], w[name][5] = w[name][1], w[name][0]
  expert_fn = functools.partial(swiglu_experts, jax.tree.map(jnp.asarray, w))
  calib = jnp.asarray(rng.standard_normal((64, d)), jnp.float32)
  sim = np.asarray(linear_cka_matrix(expert_outputs_on_tokens(expert_fn, calib, e)))
  np.testing.assert_allclose([sim[1, 4], sim[0, 5]], 1.0, rtol=1e-5)
  assert sim[~np.eye(e, dtype=bool)].max() <= 1.0 + 1e-5
  others = sim.copy()
  others[1, 4] = others[4, 1] = others[0, 5] = others[5, 0] = 0
  np.fill_diagonal(others, 0)
  rho = float(others.max()) + 1e-3  # only the duplicates qualify
  # token 0: experts 1 (primary) and 0; token 1: expert 0 (primary) then 4 (the copy of 1);
  # token 2: expert 5 (primary, copy of 0) then 4
  routing = Routing(
    jnp.asarray([[1, 0], [0, 4], [5, 4]], jnp.int32),
    jnp.asarray([[0.6, 0.4], [0.7, 0.3], [0.8, 0.2]], jnp.float32),
    jnp.ones((3, 2), bool),
  )
  out = reroute(routing, jnp.asarray(sim), 1, rho)
  assert pairs(out) == pytest.approx(
    {(0, 1): 0.6, (0, 0): 0.4, (1, 0): 0.7, (1, 1): 0.3, (2, 5): 0.8, (2, 1): 0.2}, rel=1e-6
  )
  x = jnp.asarray(rng.standard_normal((3, d)), jnp.float32)
  for name in ("dropless", "capacity"):
    cfg = moe_cfg(num_experts=e, top_k=k, dispatch=name, capacity={"factor": float(e)})
    dispatch = jax.jit(functools.partial(get_dispatcher(name), expert_fn=expert_fn, cfg=cfg))
    y0, _ = dispatch(x, routing)
    y1, _ = dispatch(x, out)
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-6)
  # fewer distinct experts in the batch: {0, 1, 4, 5} -> {0, 1, 5}
  assert {p[1] for p in pairs(out)} == {0, 1, 5}


def test_router_reroutes_only_at_evaluation():
  e, k = 6, 2
  logits = random_logits(1, 16, e)
  sim = random_similarity(np.random.default_rng(1), e)
  cfg = moe_cfg(router="sere", num_experts=e, top_k=k, sere=dict(primary_slots=1, rho=0.3))
  spec = get_router("sere")
  state = {"expert_similarity": jnp.asarray(sim)}
  plain = top_k_routing(logits, k)
  route = {
    train: jax.jit(functools.partial(call_router, "sere", moe=cfg, rng=None, train=train))
    for train in (True, False)
  }
  trained = route[True](jnp.asarray(logits), state=state)
  np.testing.assert_array_equal(trained.routing.expert_index, plain.expert_index)
  ev = route[False](jnp.asarray(logits), state=state)
  assert pairs(ev.routing) == pytest.approx(brute_force(plain, sim, 1, 0.3), rel=1e-6)
  default = route[False](jnp.asarray(logits), state=spec.init_state(e))  # identity: no-op
  assert pairs(default.routing) == pytest.approx(pairs(plain), rel=1e-6)
