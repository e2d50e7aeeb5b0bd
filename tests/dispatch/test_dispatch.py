"""Both dispatch backends against a plain numpy per-token loop (fp32, 1e-5),
GShard capacity drops against a brute-force priority simulation, and
capacity/dropless invariants under hypothesis.

Dropless runs at dropless.tile 1 (no padding: a row off by one lands in another
token's or expert's row), 3 (groups end mid-tile) and the default 128 (where the
padding would hide such a shift)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moejax.dispatch import get_dispatcher
from moejax.dispatch.capacity import expert_capacity
from moejax.experts import swiglu_experts
from moejax.routing import get_router
from tests.helpers import moe_cfg, random_logits

D, F = 8, 12


def expert_weights(seed, num_experts):
  rng = np.random.default_rng(seed)

  def w(*s):
    return (rng.standard_normal(s) / np.sqrt(s[-2])).astype(np.float32)

  return {
    "w_gate": w(num_experts, D, F),
    "w_up": w(num_experts, D, F),
    "w_down": w(num_experts, F, D),
  }


def numpy_expert(weights, e, x):
  g, u = x @ weights["w_gate"][e], x @ weights["w_up"][e]
  return (g / (1 + np.exp(-g)) * u) @ weights["w_down"][e]


def reference_loop(x, routing, weights, keep=None):
  """y[t] = sum over valid (kept) slots of weight * expert(x[t]), one token at a time."""
  x = np.asarray(x, np.float64)
  idx, w, valid = (
    np.asarray(a) for a in (routing.expert_index, routing.combine_weight, routing.valid)
  )
  keep = valid if keep is None else keep
  y = np.zeros_like(x)
  for t in range(x.shape[0]):
    for s in range(idx.shape[1]):
      if keep[t, s]:
        y[t] += w[t, s] * numpy_expert(weights, idx[t, s], x[t])
  return y


def gshard_keep(routing, num_experts, capacity):
  """Brute-force GShard priority: slot 0 of every token, then slot 1, ...; first come first kept."""
  idx, valid = np.asarray(routing.expert_index), np.asarray(routing.valid)
  used = np.zeros(num_experts, int)
  keep = np.zeros_like(valid)
  for s in range(idx.shape[1]):
    for t in range(idx.shape[0]):
      if valid[t, s] and used[idx[t, s]] < capacity:
        keep[t, s] = True
        used[idx[t, s]] += 1
  return keep


TILES = [1, 3, 128]  # 128: the default dropless.tile


@functools.cache
def jitted_dispatch(cfg):
  """cfg.dispatch as one jitted function of (x, routing, weights), compiled once per cfg
  and shape (eager dispatch compiles op by op: several times slower here)."""

  def dispatch(x, routing, weights):
    return get_dispatcher(cfg.dispatch)(x, routing, functools.partial(swiglu_experts, weights), cfg)

  return jax.jit(dispatch)


def dispatch(x, routing, weights, cfg):
  return jitted_dispatch(cfg)(jnp.asarray(x), routing, jax.tree.map(jnp.asarray, weights))


def run(dispatch_name, router_name, seed, t, e, k, **cfg_kw):
  cfg = moe_cfg(router=router_name, dispatch=dispatch_name, num_experts=e, top_k=k, **cfg_kw)
  spec = get_router(router_name)
  logits = random_logits(seed, t, e)
  state = spec.initial_state(e)
  routing = spec.route(jnp.asarray(logits), cfg=cfg, state=state, rng=None, train=False).routing
  x = np.random.default_rng(seed + 7).standard_normal((t, D)).astype(np.float32)
  weights = expert_weights(seed, e)
  y, metrics = dispatch(x, routing, weights, cfg)
  return x, routing, weights, np.asarray(y), metrics, cfg


@pytest.mark.parametrize("router", ["topk", "sigmoid_bias", "expert_choice"])
@pytest.mark.parametrize("dispatch,tile", [("dropless", t) for t in TILES] + [("capacity", 128)])
def test_dispatch_equals_per_token_loop(dispatch, tile, router):
  # capacity.factor = E makes C >= T * k: nothing can drop.
  x, routing, weights, y, metrics, cfg = run(
    dispatch, router, 3, 24, 6, 2, capacity={"factor": 6.0}, dropless={"tile": tile}
  )
  assert float(metrics["dropped_fraction"]) == 0.0
  np.testing.assert_allclose(y, reference_loop(x, routing, weights), rtol=1e-5, atol=1e-5)


@settings(max_examples=20)  # each new shape compiles (suite budget)
@given(
  st.integers(0, 10_000),
  st.sampled_from([(16, 4, 2), (9, 8, 3), (20, 3, 1)]),
  st.sampled_from([0.25, 0.5, 1.0, 1.25]),
)
def test_capacity_drops_follow_gshard_priority(seed, shape, capacity_factor):
  t, e, k = shape
  x, routing, weights, y, metrics, cfg = run(
    "capacity", "topk", seed, t, e, k, capacity={"factor": capacity_factor, "min": 1}
  )
  capacity = expert_capacity(t, e, k, capacity_factor, 1)
  keep = gshard_keep(routing, e, capacity)
  # capacity is never exceeded
  counts = np.bincount(np.asarray(routing.expert_index)[keep], minlength=e)
  assert counts.max() <= capacity
  np.testing.assert_allclose(
    float(metrics["dropped_fraction"]), 1 - keep.sum() / (t * k), atol=1e-7
  )
  np.testing.assert_allclose(y, reference_loop(x, routing, weights, keep), rtol=1e-5, atol=1e-5)


@settings(max_examples=20)  # each new shape compiles (suite budget)
@given(
  st.integers(0, 10_000),
  st.sampled_from([(16, 4, 2), (9, 8, 3), (20, 3, 1)]),
  st.sampled_from(TILES),
)
def test_dropless_drops_nothing_under_any_skew(seed, shape, tile):
  t, e, k = shape
  x, routing, weights, y, metrics, cfg = run(
    "dropless", "topk", seed, t, e, k, dropless={"tile": tile}
  )
  assert float(metrics["dropped_fraction"]) == 0.0
  np.testing.assert_allclose(y, reference_loop(x, routing, weights), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tile", TILES)
def test_invalid_slots_contribute_nothing(tile):
  x, routing, weights, _, _, cfg = run("dropless", "topk", 1, 10, 4, 2, dropless={"tile": tile})
  valid = np.asarray(routing.valid).copy()
  valid[::2, 1] = False
  routing = routing.with_valid(jnp.asarray(valid))
  for name in ("dropless", "capacity"):
    y, _ = dispatch(
      x, routing, weights, moe_cfg(dispatch=name, num_experts=4, top_k=2, dropless={"tile": tile})
    )
    np.testing.assert_allclose(y, reference_loop(x, routing, weights), rtol=1e-5, atol=1e-5)
