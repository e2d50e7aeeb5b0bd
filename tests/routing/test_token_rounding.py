"""Token rounding (SonicMoE, router 'topk_rounded') against a numpy brute force,
its rounding guarantees, the reference's gates (own top-k pairs renormalised,
added pairs raw P) on a hand-worked case, the top-k limit, eval fallback and
config errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moejax.config import base_config
from moejax.validation import validate_config
from moejax.dispatch import get_dispatcher, padding_waste
from moejax.errors import ConfigError
from moejax.experts import swiglu_experts
from moejax.routing import call_router
from moejax.routing.token_rounding import rounded_counts
from tests.helpers import moe_cfg, random_logits

CASES = settings(max_examples=8)  # each new shape compiles (suite budget)
MODES = ("up", "down", "nearest")
# T a multiple of every tile (no cap at T), few shapes (each compiles), random contents.
cases = st.tuples(
  st.sampled_from([(48, 4, 2), (32, 8, 3), (64, 6, 1)]),
  st.sampled_from([1, 2, 4, 8, 16]),
  st.sampled_from(MODES),
  st.integers(0, 2**16),
)


def route(logits, train=True, **cfg):
  cfg = moe_cfg(router="topk_rounded", num_experts=logits.shape[1], **cfg)
  return call_router("topk_rounded", jnp.asarray(logits), cfg, train=train)


def pairs(routing):
  """{(token, expert): weight} of the valid slots."""
  idx, w, valid = (
    np.asarray(a) for a in (routing.expert_index, routing.combine_weight, routing.valid)
  )
  return {(t, int(idx[t, s])): float(w[t, s]) for t, s in zip(*np.nonzero(valid))}


def brute_force(probs, k, tile, mode):
  """SonicMoE TR step by step in numpy: TC top-k, round counts, per expert keep the
  top-k tokens (by renormalised prob) first, then the others (by P), first f~_e of
  them; ties by P, then token index. Returns also the gates: renormalised top-k
  prob for a token's own top-k pairs, raw P for the others."""
  t, e = probs.shape
  top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
  chose = np.zeros((t, e), bool)
  chose[np.arange(t)[:, None], top] = True
  p64 = probs.astype(np.float64)
  top_p = np.where(chose, p64, 0.0)
  renorm = top_p / top_p.sum(1, keepdims=True)
  f = chose.sum(0)
  rounded = {"up": np.ceil(f / tile), "down": np.floor(f / tile), "nearest": np.round(f / tile)}[
    mode
  ]  # np.round: half to even
  target = np.minimum(rounded.astype(int) * tile, t)
  kept = np.zeros((t, e), bool)
  for j in range(e):

    def by_score(score):
      return np.lexsort((np.arange(t), -p64[:, j], -score))

    own = [i for i in by_score(renorm[:, j]) if chose[i, j]]
    others = [i for i in by_score(p64[:, j]) if not chose[i, j]]
    kept[(own + others)[: target[j]], j] = True
  return kept, f, target, np.where(chose, renorm, p64)


@pytest.mark.integration
@CASES
@given(cases)
def test_matches_numpy_brute_force(case):
  (t, e, k), tile, mode, seed = case
  out = route(random_logits(seed, t, e), top_k=k, topk_rounded=dict(tile=tile, mode=mode))
  probs = np.asarray(out.probs)
  kept, _, _, gates = brute_force(probs, k, tile, mode)
  expected = {(i, j): float(gates[i, j]) for i, j in zip(*np.nonzero(kept))}
  got = pairs(out.routing)
  assert got.keys() == expected.keys()  # the kept and the dropped pairs
  np.testing.assert_allclose([got[p] for p in expected], list(expected.values()), rtol=1e-6)
  r = out.routing
  assert r.num_slots == (k if mode == "down" else e)
  assert len(got) <= r.max_valid <= t * e  # the bound the dropless buffers are sized by
  np.testing.assert_array_equal(np.where(r.valid, 0.0, r.combine_weight), 0.0)
  # slots hold distinct experts, the first k being the token's top-k
  idx = np.asarray(r.expert_index)
  assert all(len(set(row)) == len(row) for row in idx.tolist())
  np.testing.assert_array_equal(
    np.sort(idx[:, :k], 1), np.sort(np.argsort(-probs, 1, kind="stable")[:, :k], 1)
  )


@CASES
@given(cases)
def test_counts_are_tile_multiples_within_rounding_distance(case):
  (t, e, k), tile, mode, seed = case
  logits = random_logits(seed, t, e)
  out = route(logits, top_k=k, topk_rounded=dict(tile=tile, mode=mode))
  counts = np.asarray(out.routing.expert_counts(e))
  plain = call_router("topk", jnp.asarray(logits), moe_cfg(num_experts=e, top_k=k))
  f = np.asarray(plain.routing.expert_counts(e))
  assert (counts % tile == 0).all()
  assert float(padding_waste(jnp.asarray(counts), tile)) == 0.0
  diff = counts - f
  if mode == "nearest":
    assert (np.abs(diff) <= tile / 2).all()
  else:
    assert (np.abs(diff) < tile).all()
    assert (diff >= 0).all() if mode == "up" else (diff <= 0).all()


@CASES
@given(cases)
def test_tile_one_is_top_k(case):
  (t, e, k), _, mode, seed = case
  logits = random_logits(seed, t, e)
  rounded = route(logits, top_k=k, topk_rounded=dict(tile=1, mode=mode))
  cfg = moe_cfg(num_experts=e, top_k=k, routing={"renormalize": True})
  plain = call_router("topk", jnp.asarray(logits), cfg, train=True)
  got, expected = pairs(rounded.routing), pairs(plain.routing)
  assert got.keys() == expected.keys()
  np.testing.assert_allclose([got[p] for p in expected], list(expected.values()), rtol=1e-6)
  assert float(rounded.metrics["rounding_dropped_fraction"]) == 0.0
  assert float(rounded.metrics["rounding_added_fraction"]) == 0.0


# Hand-worked case (T 4, E 3, K 2, tile 2): P per token, its top-2 and their sums
#   t0 [.5 .3  .2 ] top {0,1} sum .8     t1 [.6 .1  .3 ] top {0,2} sum .9
#   t2 [.2 .5  .3 ] top {1,2} sum .8     t3 [.4 .35 .25] top {0,1} sum .75
# counts f = [3, 3, 2].
HAND_PROBS = np.array(
  [[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.2, 0.5, 0.3], [0.4, 0.35, 0.25]], np.float32
)
HAND_GATES = {
  # 'up' -> [4, 4, 2]: expert 0 adds t2 (its only non-top-k token), expert 1 adds t1.
  # Own top-k pairs get P / (top-k sum), the two added pairs their raw P.
  "up": {
    (0, 0): 0.5 / 0.8,
    (0, 1): 0.3 / 0.8,
    (1, 0): 0.6 / 0.9,
    (1, 2): 0.3 / 0.9,
    (1, 1): 0.1,  # added
    (2, 1): 0.5 / 0.8,
    (2, 2): 0.3 / 0.8,
    (2, 0): 0.2,  # added
    (3, 0): 0.4 / 0.75,
    (3, 1): 0.35 / 0.75,
  },
  # 'down' -> [2, 2, 2]: expert 0 drops its lowest renormalised score (t3, .533),
  # expert 1 drops t0 (.375). Kept pairs stay renormalised over the token's whole
  # top-k (t0's gate is .625, t3's .467, not 1).
  "down": {
    (0, 0): 0.5 / 0.8,
    (1, 0): 0.6 / 0.9,
    (1, 2): 0.3 / 0.9,
    (2, 1): 0.5 / 0.8,
    (2, 2): 0.3 / 0.8,
    (3, 1): 0.35 / 0.75,
  },
}


@pytest.mark.parametrize("mode", ["up", "down"])
def test_gates_hand_worked_own_pairs_renormalised_added_pairs_raw(mode):
  """The reference (benchmarks/moe-token-rounding.py) scatters the renormalised top-k
  values into the softmax scores before reading the gates."""
  out = route(np.log(HAND_PROBS), top_k=2, topk_rounded=dict(tile=2, mode=mode))
  np.testing.assert_allclose(np.asarray(out.probs), HAND_PROBS, rtol=1e-6)
  got, expected = pairs(out.routing), HAND_GATES[mode]
  assert got.keys() == expected.keys()
  np.testing.assert_allclose([got[p] for p in expected], list(expected.values()), rtol=1e-6)


def test_rounded_counts_worked_example():
  counts = jnp.array([0, 5, 8, 12, 13, 4, 20])
  expect = {
    "up": [0, 8, 8, 16, 16, 8, 24],
    "down": [0, 0, 8, 8, 8, 0, 16],
    # 12/8 = 1.5 -> 2 (even), 4/8 = 0.5 -> 0 (even), 20/8 = 2.5 -> 2 (even)
    "nearest": [0, 8, 8, 16, 16, 0, 16],
  }
  for mode, values in expect.items():
    np.testing.assert_array_equal(rounded_counts(counts, 8, mode, 100), values)
  np.testing.assert_array_equal(rounded_counts(counts, 8, "up", 14), [0, 8, 8, 14, 14, 8, 14])


def test_dropless_pads_nothing_when_tiles_match():
  """Rounding tile == dispatch tile: zero padding rows, and the output is the per-token loop."""
  from tests.contract.dispatch_oracles import expert_weights, reference_loop

  t, e, k, tile = 64, 4, 2, 8
  out = route(random_logits(5, t, e), top_k=k, topk_rounded=dict(tile=tile, mode="up"))
  x = np.random.default_rng(0).standard_normal((t, 8)).astype(np.float32)
  weights = expert_weights(0, e)
  fn = functools.partial(swiglu_experts, jax.tree.map(jnp.asarray, weights))
  for name in ("dropless", "dropless_memeff"):
    cfg = moe_cfg(num_experts=e, top_k=k, dropless={"tile": tile, "block": 16})
    y, metrics = get_dispatcher(name)(jnp.asarray(x), out.routing, fn, cfg)
    assert float(metrics["padding_waste"]) == 0.0
    np.testing.assert_allclose(y, reference_loop(x, out.routing, weights), rtol=1e-5, atol=1e-5)


def test_eval_falls_back_to_plain_top_k():
  logits = random_logits(3, 40, 8)
  out = route(logits, train=False, top_k=2, topk_rounded=dict(tile=16, mode="up"))
  plain = call_router(
    "topk", jnp.asarray(logits), moe_cfg(num_experts=8, top_k=2, routing={"renormalize": True})
  )
  assert out.routing.num_slots == 2
  got, expected = pairs(out.routing), pairs(plain.routing)  # the reference's renormalised top-k
  assert got.keys() == expected.keys()
  np.testing.assert_allclose([got[p] for p in expected], list(expected.values()), rtol=1e-6)
  assert pairs(
    route(logits, train=True, top_k=2, topk_rounded=dict(tile=16, mode="up")).routing
  ) != pairs(plain.routing)


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("mode", "sideways", "model.moe.topk_rounded.mode='sideways'"),
    ("tile", 0, "model.moe.topk_rounded.tile=0"),
    ("tile", -4, "model.moe.topk_rounded.tile=-4"),
  ],
)
def test_bad_rounding_config_names_key_and_value(key, value, message):
  c = base_config()
  c.model.moe.router = "topk_rounded"
  c.model.moe.topk_rounded[key] = value
  with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
    validate_config(c)
  with pytest.raises(ConfigError, match=r"model\.moe\.topk_rounded\."):
    route(random_logits(0, 8, 4), top_k=2, topk_rounded={key: value})


def test_default_config_with_token_rounding_validates():
  c = base_config()
  c.model.moe.router = "topk_rounded"
  validate_config(c)
  c.model.moe.top_k = 9
  with pytest.raises(ConfigError, match="model.moe.top_k=9"):
    validate_config(c)
