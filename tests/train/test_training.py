"""Training end to end on the tiny config: learning, exact resume,
determinism, checkpoint safety and bad input."""

import hashlib
import math
import os

import jax
import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.train.restore import load_from_workdir
from moejax.train import step as step_lib
from moejax.train.checkpoint import Checkpointer
from moejax.train.loop import NonFiniteLossError, init_state, train_and_evaluate
from tests.helpers import set_key

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


def params_of(run):
  return jax.tree.map(np.asarray, run.state.params)


def tree_digest(path):
  h = hashlib.sha256()
  for root, _, files in sorted(os.walk(path)):
    for name in sorted(files):
      full = os.path.join(root, name)
      h.update(full.encode())
      with open(full, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


@pytest.mark.integration
def test_thirty_steps_lower_the_loss(tiny_config, tmp_path):
  run = train_and_evaluate(tiny_config(), str(tmp_path))
  first, last = run.history[0]["ce_loss"], run.history[-1]["ce_loss"]
  assert first > last + 0.5, (first, last)
  assert run.eval["val_loss"] < math.log(256) - 0.5
  for name in ("metrics.jsonl", "expert_load.png", "tensorboard"):
    assert os.path.exists(tmp_path / name), name
  rec = run.history[-1]
  for key in (
    "moe/layer0/load_fraction/e0",
    "moe/layer0/max_over_mean_load",
    "moe/layer0/routing_entropy",
    "moe/layer0/dropped_fraction",
    "moe/layer0/z_loss",
    "moe/layer0/load_balance",
    "tokens_per_second",
  ):
    assert key in rec, key
  np.testing.assert_allclose(
    sum(rec[f"moe/layer1/load_fraction/e{e}"] for e in range(8)), 1.0, rtol=1e-5
  )
  # what experiments.generate restores is what training ended with
  _, _, params, _, tokenizer = load_from_workdir(str(tmp_path), for_generation=True)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, params), params_of(run))
  assert tokenizer.decode(tokenizer.encode("ROMEO:")) == "ROMEO:"


@pytest.mark.integration
@pytest.mark.parametrize("arg", ["", "router=sigmoid_bias"])
def test_resume_is_bit_exact(tiny_config, tmp_path, arg):
  config = tiny_config(arg, steps=6, checkpoint_every=100, log_every=1)
  straight = train_and_evaluate(config, str(tmp_path / "straight"), write_metrics=False)
  train_and_evaluate(config, str(tmp_path / "resumed"), write_metrics=False, stop_at_step=3)
  resumed = train_and_evaluate(config, str(tmp_path / "resumed"), write_metrics=False)
  assert resumed.start_step == 3 and int(resumed.state.step) == 6
  jax.tree.map(np.testing.assert_array_equal, params_of(straight), params_of(resumed))
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.tree.map(np.asarray, straight.state.rest),
    jax.tree.map(np.asarray, resumed.state.rest),
  )
  # the resumed half saw the same batches: same logged losses after the stop
  assert [r["loss"] for r in straight.history if r["step"] > 3] == [
    r["loss"] for r in resumed.history
  ] and len(resumed.history) == 3


@pytest.mark.integration
def test_same_seed_same_metrics(tiny_config, tmp_path):
  config = tiny_config(steps=4, log_every=2)
  a = train_and_evaluate(config, str(tmp_path / "a"), write_metrics=False)
  b = train_and_evaluate(config, str(tmp_path / "b"), write_metrics=False)

  def strip(history):
    return [{k: v for k, v in r.items() if k != "tokens_per_second"} for r in history]

  assert strip(a.history) == strip(b.history)
  config.seed = 1
  c = train_and_evaluate(config, str(tmp_path / "c"), write_metrics=False)
  assert strip(c.history) != strip(a.history)


def test_incompatible_checkpoint_is_refused_and_left_untouched(tiny_config, tmp_path):
  train_and_evaluate(tiny_config(steps=5), str(tmp_path), write_metrics=False)
  before = tree_digest(tmp_path / "checkpoints")
  other = tiny_config(steps=10)
  other.model.d_model = 64
  with pytest.raises(ConfigError, match=r"model\.d_model: checkpoint=32 config=64"):
    train_and_evaluate(other, str(tmp_path), write_metrics=False)
  assert tree_digest(tmp_path / "checkpoints") == before


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny_config, tmp_path, monkeypatch):
  """Params and loss turn NaN from step 7 on: training stops, step 6 stays restorable."""
  real_make = step_lib.make_train_step

  def make_diverging_step(*args):
    step_fn = real_make(*args)

    def diverging(state, batch):
      state, metrics = step_fn(state, batch)
      if int(state.step) >= 7:
        state = state.replace(params=jax.tree.map(lambda p: p * np.nan, state.params))
        metrics = {**metrics, "loss": np.float32(np.nan)}
      return state, metrics

    return diverging

  monkeypatch.setattr(step_lib, "make_train_step", make_diverging_step)
  config = tiny_config(steps=30, checkpoint_every=2, log_every=1)
  with pytest.raises(
    NonFiniteLossError, match="loss is nan at step 7.*last good checkpoint .step 6."
  ):
    train_and_evaluate(config, str(tmp_path), write_metrics=False)
  ckpt = Checkpointer(str(tmp_path), 2)
  assert ckpt.latest_step() == 6
  _, state, _ = init_state(config)
  restored, _ = ckpt.restore(6, jax.tree.map(np.asarray, state))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(restored.params))


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("model.moe.top_k", 9, r"model\.moe\.top_k=9 must be <= model\.moe\.num_experts=8"),
    ("model.moe.num_experts", 0, r"model\.moe\.num_experts=0 must be >= 1"),
    ("model.moe.capacity.factor", 0.0, r"model\.moe\.capacity\.factor=0\.0 must be a .* > 0"),
    ("model.moe.capacity.factor", -1.0, r"model\.moe\.capacity\.factor=-1\.0 must be a .* > 0"),
    ("model.moe.dropless.min_block", 0, r"model\.moe\.dropless\.min_block=0 must be an int > 0"),
    (
      "model.moe.router",
      "nope",
      r"model\.moe\.router='nope' is not known; valid: .*expert_choice, .*sigmoid_bias, .*topk",
    ),
    (
      "model.moe.dispatch",
      "nope",
      r"model\.moe\.dispatch='nope' is not known; valid: capacity, dropless",
    ),
    ("data.name", "nope", r"data\.name='nope'"),
    ("data.seq_len", 4096, r"data\.seq_len=4096 exceeds model\.max_seq_len=1024"),
  ],
)
def test_bad_input_is_rejected_before_compilation(
  tiny_config, tmp_path, key, value, message, monkeypatch
):
  config = tiny_config()
  set_key(config, key, value)
  compiled = []
  monkeypatch.setattr(step_lib, "make_train_step", lambda *a: compiled.append(a))
  with pytest.raises(ConfigError, match=message):
    train_and_evaluate(config, str(tmp_path), write_metrics=False)
  assert not compiled
