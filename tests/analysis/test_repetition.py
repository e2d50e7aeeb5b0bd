"""RepetitionCurse (moejax/analysis/repetition.py): a repeated token routes every
position of every layer to one top-k set (exact), and the latency model's
device counts against brute force and closed forms."""

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.analysis import repetition as rep
from moejax.dispatch.capacity import expert_capacity

LENGTH = 24


def test_a_repeated_token_routes_every_position_of_every_layer_alike(tiny_model):
  config, graphdef, state = tiny_model  # RoPE, no BOS, 8 experts, top-2
  moe, params, rest = config.model.moe, state.params, state.rest
  repeated = jnp.asarray(np.array([[5] * LENGTH, [77] * LENGTH, [200] * LENGTH]), jnp.int32)
  natural = jnp.asarray(np.random.default_rng(0).integers(0, 256, (3, LENGTH)), jnp.int32)
  for (index, valid), (nat_index, nat_valid) in zip(
    rep.routing_of(graphdef, params, rest, repeated),
    rep.routing_of(graphdef, params, rest, natural),
  ):
    index = np.asarray(index).reshape(3, LENGTH, moe.top_k)
    for row in index:  # one top-k set at every position (exact)
      assert all(sorted(s) == sorted(row[0]) for s in row.tolist())
    report = rep.layer_report(
      index[:1].reshape(LENGTH, -1), np.asarray(valid)[:LENGTH], 1, moe.num_experts, expert_shards=4
    )
    assert report["same_set_fraction"] == 1.0
    # all L * k rows on k experts: max / mean = E / k; one expert block holds them all
    # (or two, when the set straddles blocks)
    assert report["max_over_mean_load"] == moe.num_experts / moe.top_k
    nat = np.asarray(nat_index).reshape(3, LENGTH, moe.top_k)
    assert rep.same_set_fraction(nat) < 1.0


def test_device_rows_equal_a_token_by_token_count():
  rng = np.random.default_rng(1)
  index = rng.integers(0, 16, (40, 4))
  valid = rng.random((40, 4)) < 0.8
  rows = rep.device_rows(index, valid, 16, expert_shards=4, token_groups=2)
  expected = np.zeros((2, 4), int)
  for t in range(40):
    for s in range(4):
      if valid[t, s]:
        expected[t // 20, index[t, s] // 4] += 1
  np.testing.assert_array_equal(rows, expected)
  assert rep.busiest_device(rows) == rows.max() / (valid.sum() / 8)


def test_one_set_puts_every_row_on_its_block_and_capacity_caps_it():
  tokens, experts, top_k = 64, 8, 2
  index = np.tile([0, 1], (tokens, 1))  # every token: experts {0, 1}, both in block 0
  valid = np.ones_like(index, bool)
  rows = rep.device_rows(index, valid, experts, expert_shards=4)
  np.testing.assert_array_equal(rows, [[tokens * top_k, 0, 0, 0]])
  assert rep.busiest_device(rows) == 4.0  # all rows on 1 of 4 devices
  capacity = expert_capacity(tokens, experts, top_k, capacity_factor=1.25, min_capacity=4)
  capped = rep.capped_load(rep.expert_load(index, valid, experts), capacity)
  assert capped.max() == capacity == 20  # ceil(1.25 * 64 * 2 / 8)
  assert capped.reshape(4, 2).sum(1).max() <= capacity * (experts // 4)


def test_indivisible_groups_are_refused():
  with pytest.raises(ValueError, match="do not divide"):
    rep.device_rows(np.zeros((10, 2), int), np.ones((10, 2), bool), 8, expert_shards=3)


def test_attack_prompts_by_hand():
  rows, span = rep.attack_prompts([5, 6, 7, 8], 10, prefix=[1], pattern=2, chat=([2, 3], [4]))
  np.testing.assert_array_equal(
    rows, [[1, 2, 3, 5, 6, 5, 6, 5, 6, 4], [1, 2, 3, 7, 8, 7, 8, 7, 8, 4]]
  )
  assert span == slice(3, 9)
  rows, span = rep.attack_prompts([9, 4], 5)  # the paper's prompt: one token, no BOS
  np.testing.assert_array_equal(rows, [[9] * 5, [4] * 5])
  assert span == slice(0, 5)
  assert rep.attack_prompts([5, 6, 7], 7, pattern=3)[0].tolist() == [[5, 6, 7, 5, 6, 7, 5]]
  with pytest.raises(ValueError, match="pattern=2"):
    rep.attack_prompts([5, 6, 7], 8, pattern=2)
  with pytest.raises(ValueError, match="leaves 1 positions"):
    rep.attack_prompts([5, 6], 4, prefix=[1, 1], chat=([2], []), pattern=2)


def test_forced_identity_is_detected_and_a_prefix_breaks_it_on_a_random_model(tiny_model):
  """No BOS: every position of a one-token prompt is position 0 again (forced, so
  same_set_fraction = 1 says nothing). After a prefix token the repeated positions see
  different histories; on a random-init RoPE model their top-k sets differ."""
  config, graphdef, state = tiny_model  # RoPE, no BOS, 8 experts, top-2
  moe, params, rest = config.model.moe, state.params, state.rest
  ids = [5, 77, 200]
  for prefix, forced in (((), 1.0), ((1,), 0.0), ((84, 104, 101, 32), 0.0)):
    rows, span = rep.attack_prompts(ids, LENGTH, prefix=prefix)
    assert rep.forced_identical(rows) == forced
    fractions = [
      rep.same_set_fraction(np.asarray(index).reshape(3, LENGTH, moe.top_k), span)
      for index, _ in rep.routing_of(graphdef, params, rest, jnp.asarray(rows))
    ]
    if forced:
      assert fractions == [1.0] * len(fractions)
    else:
      assert min(fractions) < 1.0
  assert rep.forced_identical(np.array([[3, 3, 4, 3], [2, 2, 2, 2]])) == pytest.approx(4 / 6)
  pattern, _ = rep.attack_prompts([5, 6], LENGTH, pattern=2)
  assert rep.forced_identical(pattern) == 0.0


def test_drop_rate_and_simulated_ttft_closed_forms():
  assert rep.drop_rate(np.array([10, 2, 0, 4]), 3) == 8 / 16  # (10 - 3) + (4 - 3) of 16
  assert rep.drop_rate(np.array([3, 3]), 3) == 0.0
  tokens = 16  # 8 experts on 8 devices, top-2
  skewed = np.tile([0, 1], (tokens, 1))  # all on devices 0 and 1: busiest 16, balanced 4
  spread = np.stack([2 * np.arange(tokens) % 8, (2 * np.arange(tokens) + 1) % 8], 1)  # 4 each
  valid = np.ones((tokens, 2), bool)
  out = rep.simulated_ttft([(skewed, valid), (spread, valid)], 8, expert_shards=8)
  assert out == {"rows": 16 + 4, "over_balanced": (16 + 4) / (4 + 4)}
  half = valid.copy()
  half[::2] = False  # invalid slots are not rows
  assert rep.simulated_ttft([(skewed, half)], 8, 8) == {"rows": 8, "over_balanced": 4.0}


def test_kind_report_gives_each_layers_capped_figures_by_hand():
  """One layer, 8 tokens (2 rows of 4), top-1, every token on expert 0 of 4, 2 shards,
  capacity 3: load [8, 0, 0, 0], 5 of 8 slots dropped; capped load [3, 0, 0, 0], so
  the busiest shard holds 3 rows against a balanced 8 / 2."""
  index = np.zeros((8, 1), np.int64)
  valid = np.ones((8, 1), bool)
  (report,) = rep.kind_report([(index, valid)], batch=2, num_experts=4, expert_shards=2, capacity=3)
  assert report["load"] == [8, 0, 0, 0]
  assert report["drop_rate"] == 5 / 8
  assert report["busiest_device_capped"] == 3 / 4
  assert report["same_set_fraction"] == 1.0
