"""Domain fine-tuning runs (moejax/posttrain/domain_finetune.py): the round robin
keeps every prefix within one row of its share, a one-hot mixture reads exactly
the expert's windows, pool epochs are permutations, a run equals the trainer's own
jitted step on the same batches (and leaves the base untouched), and window losses
are the evaluation harness's log-probabilities."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from moejax.posttrain import domain_finetune as ft
from moejax.posttrain.calibration import calibration_windows


@pytest.mark.parametrize("alpha", [[0.5, 0.3, 0.2], [0.1, 0.0, 0.9], [1 / 3] * 3, [0, 1, 0]])
def test_round_robin_keeps_every_prefix_within_one_row_of_its_share(alpha):
  owner = ft.round_robin(alpha, 200)
  counts = np.cumsum(np.eye(3)[owner], axis=0)  # [rows, K]
  expected = np.arange(1, 201)[:, None] * np.asarray(alpha)[None]
  assert np.abs(counts - expected).max() < 1 + 1e-9
  assert set(np.flatnonzero(np.asarray(alpha) == 0)).isdisjoint(owner)


def test_a_one_hot_mixture_reads_exactly_the_experts_windows():
  rng = np.random.default_rng(0)
  streams = [rng.integers(0, 256, size=n).astype(np.int32) for n in (500, 700, 900)]
  steps, batch, seq_len, seed = 5, 4, 7, 3
  for k in range(3):
    got = ft.mixture_batches(streams, np.eye(3)[k], steps, batch, seq_len, seed)
    want = calibration_windows(streams[k], steps * batch, seq_len + 1, ft.SEED_STRIDE * seed + k)
    np.testing.assert_array_equal(got.reshape(-1, seq_len + 1), want)
  mixed = ft.mixture_batches(streams, [0.5, 0.25, 0.25], steps, batch, seq_len, seed)
  rows = mixed.reshape(-1, seq_len + 1)
  owner = ft.round_robin([0.5, 0.25, 0.25], steps * batch)
  for k in range(3):
    drawn = calibration_windows(streams[k], steps * batch, seq_len + 1, ft.SEED_STRIDE * seed + k)
    np.testing.assert_array_equal(rows[owner == k], drawn[: np.sum(owner == k)])


def test_pool_epochs_are_permutations_of_the_pool():
  pool = np.arange(10 * 3, dtype=np.int32).reshape(10, 3)
  rows = ft.pool_batches(pool, steps=7, batch=4, seed=1).reshape(-1, 3)
  for epoch in (rows[:10], rows[10:20]):
    assert sorted(map(tuple, epoch)) == sorted(map(tuple, pool))
  assert len(rows) == 28


@pytest.mark.integration
def test_a_run_is_the_trainers_step_on_the_same_batches(tiny_model):
  from moejax.train.optimizer import make_optimizer
  from moejax.train.step import TrainState, make_train_step

  config, graphdef, state = tiny_model
  params, rest = jax.tree.map(np.asarray, (state.params, state.rest))
  before = jax.tree.map(np.copy, params)
  rng = np.random.default_rng(0)
  batches = rng.integers(0, 256, size=(3, 2, config.data.seq_len + 1)).astype(np.int32)
  runner = ft.Finetuner(graphdef, config.train, learning_rate=2e-3, warmup=1)
  got = runner.run(params, rest, batches, seed=5, snapshot_at=(1,))
  assert sorted(got) == [1, 3]
  t = ml_collections.ConfigDict(config.train.to_dict())
  t.learning_rate, t.warmup_steps, t.min_lr_ratio, t.steps = 2e-3, 1, 1.0, 2
  optimizer = make_optimizer(t)
  step = make_train_step(graphdef, optimizer, 5)
  p = jax.tree.map(jnp.array, params)
  reference = TrainState(jnp.int32(0), p, jax.tree.map(jnp.array, rest), optimizer.init(p))
  for rows in batches:
    reference, _ = step(reference, {"inputs": rows[:, :-1], "targets": rows[:, 1:]})
  jax.tree.map(np.testing.assert_array_equal, got[3][0], jax.device_get(reference.params))
  jax.tree.map(np.testing.assert_array_equal, params, before)  # the base is not donated
  assert not all(
    np.array_equal(a, b) for a, b in zip(jax.tree.leaves(got[1][0]), jax.tree.leaves(got[3][0]))
  )


def test_window_losses_are_the_harness_log_probabilities(tiny_model):
  from moejax.evaluation.model import DecoderLM, Row, score_rows

  config, graphdef, state = tiny_model
  params, rest = jax.tree.map(np.asarray, (state.params, state.rest))
  rng = np.random.default_rng(1)
  windows = rng.integers(0, 256, size=(5, config.data.seq_len + 1)).astype(np.int32)
  got = ft.window_nats(graphdef, params, rest, windows, batch_size=4)
  width = windows.shape[1] - 1
  rows = [Row(w[:-1], w[1:], np.ones(width, bool)) for w in windows]
  scored = score_rows(DecoderLM(config.model, params, rest), rows, width, batch_size=8)
  np.testing.assert_allclose(got, [-np.mean(s.logprob) for s in scored], rtol=2e-5)
