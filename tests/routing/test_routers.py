"""Router invariants (hypothesis, >= 200 cases each) against numpy oracles."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moejax.routing import call_router
from moejax.routing.expert_choice import expert_choice_capacity
from moejax.routing.sigmoid_bias import bias_update
from tests.helpers import moe_cfg, random_logits

CASES = settings(max_examples=20)  # each new shape compiles: the suite has 15 min on 2 cores
# Few distinct shapes (each new shape compiles), many random contents.
shapes = st.sampled_from([1, 2, 5, 8]).flatmap(
  lambda e: st.tuples(
    st.sampled_from([1, 6, 16]), st.just(e), st.integers(1, e), st.integers(0, 2**16)
  )
)


def softmax(x):
  z = np.exp(x - x.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def route(name, logits, train=False, state=None, **cfg):
  cfg = moe_cfg(router=name, num_experts=logits.shape[1], **cfg)
  return call_router(name, jnp.asarray(logits), cfg, state=state, train=train)


@CASES
@given(shapes, st.booleans())
def test_topk_matches_brute_force(shape, renormalize):
  t, e, k, seed = shape
  logits = random_logits(seed, t, e)
  out = route("topk", logits, top_k=k, routing={"renormalize": renormalize})
  r = out.routing
  assert r.expert_index.shape == (t, k) and bool(jnp.all(r.valid))
  probs = softmax(logits.astype(np.float64))
  expected = np.argsort(-probs, axis=1, kind="stable")[:, :k]
  np.testing.assert_array_equal(np.sort(r.expert_index, 1), np.sort(expected, 1))
  w = np.asarray(r.combine_weight)
  assert (w >= 0).all()
  kept = np.take_along_axis(probs, np.asarray(r.expert_index), 1)
  if renormalize:
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)
    kept = kept / kept.sum(1, keepdims=True)
  np.testing.assert_allclose(w, kept, rtol=2e-6, atol=1e-7)
  # each token uses k distinct experts
  assert all(len(set(row)) == k for row in np.asarray(r.expert_index).tolist())


@CASES
@given(shapes, st.floats(0.5, 3.0))
def test_sigmoid_bias_selects_on_biased_scores_weights_on_raw(shape, scaling):
  t, e, k, seed = shape
  logits = random_logits(seed, t, e)
  bias = np.random.default_rng(seed + 1).normal(0, 0.3, e).astype(np.float32)
  out = route(
    "sigmoid_bias",
    logits,
    top_k=k,
    routing={"routed_scaling_factor": scaling},
    state={"bias": jnp.asarray(bias)},
  )
  r = out.routing
  scores = 1 / (1 + np.exp(-logits.astype(np.float64)))
  expected = np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]
  np.testing.assert_array_equal(np.sort(r.expert_index, 1), np.sort(expected, 1))
  w = np.asarray(r.combine_weight)
  raw = np.take_along_axis(scores, np.asarray(r.expert_index), 1)
  np.testing.assert_allclose(w, scaling * raw / raw.sum(1, keepdims=True), rtol=2e-6)
  assert (w >= 0).all() and bool(jnp.all(r.valid))


@pytest.mark.integration
@CASES
@given(shapes, st.sampled_from([0.5, 1.0, 1.25, 2.0]))
def test_expert_choice_each_expert_takes_exactly_capacity(shape, capacity_factor):
  t, e, k, seed = shape
  logits = random_logits(seed, t, e)
  out = route("expert_choice", logits, top_k=k, capacity={"factor": capacity_factor})
  r = out.routing
  c = min(t, max(1, math.ceil(capacity_factor * k * t / e)))
  assert c == expert_choice_capacity(t, e, k, capacity_factor)
  valid = np.asarray(r.valid)
  np.testing.assert_array_equal(valid.sum(0), np.full(e, c))
  probs = softmax(logits.astype(np.float64))
  for j in range(e):  # brute force: the C most probable tokens for expert j
    expected = set(np.argsort(-probs[:, j], kind="stable")[:c].tolist())
    assert set(np.flatnonzero(valid[:, j]).tolist()) == expected
  w = np.asarray(r.combine_weight)
  np.testing.assert_allclose(w, np.where(valid, probs, 0.0), rtol=2e-6, atol=1e-8)
  np.testing.assert_array_equal(np.asarray(r.expert_index), np.tile(np.arange(e), (t, 1)))


def test_bias_moves_against_imbalance():
  counts = jnp.array([10, 2, 4, 0])  # mean 4
  new = bias_update(jnp.zeros(4), counts, 0.1)
  np.testing.assert_allclose(new, [-0.1, 0.1, 0.0, 0.1])


def test_bias_updates_balance_a_skewed_router():
  """Repeated sign updates on a fixed skewed batch drive max/mean load toward 1."""
  logits = random_logits(0, 256, 8, scale=1.0)
  logits[:, 0] += 3.0  # expert 0 is everybody's favourite
  state = {"bias": jnp.zeros(8)}
  loads = []
  for _ in range(300):
    out = route(
      "sigmoid_bias", logits, train=True, state=state, top_k=2, routing={"bias_update_rate": 0.01}
    )
    counts = np.asarray(out.routing.expert_counts(8))
    loads.append(counts.max() / counts.mean())
    state = out.state
  assert loads[0] > 3.0
  assert np.mean(loads[-20:]) < 1.3
  assert float(state["bias"][0]) < 0  # the favourite was pushed down


def test_bias_frozen_in_eval():
  out = route(
    "sigmoid_bias", random_logits(0, 16, 4), train=False, top_k=1, state={"bias": jnp.ones(4)}
  )
  np.testing.assert_array_equal(out.state["bias"], np.ones(4))
