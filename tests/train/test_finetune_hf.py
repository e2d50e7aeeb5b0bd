"""Fine-tuning imported checkpoints with the trainer (--config.init.hf_dir):
training starts from exactly the HF weights, the loss drops over 30 steps, and
the exported result loads in transformers with moejax's logits (1e-4).
The family in the config must match the directory's, checked before anything
is written."""

import os

import jax
import numpy as np
import pytest

from moejax.configs import finetune_hf
from moejax.errors import ConfigError
from moejax.interop.convert import export_hf, import_hf
from moejax.train.load import load_model
from moejax.train import init_from
from moejax.train.loop import init_state, train_and_evaluate
from tests.interop.hf_tiny import make_model, save_model
from tests.interop.export_checks import assert_export_matches

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


@pytest.fixture(scope="module")
def byte_checkpoints(tmp_path_factory):
  made = {}

  def get(family):
    if family not in made:
      model = make_model(family, vocab_size=256)
      made[family] = save_model(model, str(tmp_path_factory.mktemp(f"{family}_hf")))
    return made[family]

  return get


def finetune_config(family, hf_dir, steps=30):
  c = finetune_hf.get_config(f"family={family},steps={steps},seq_len=32,batch_size=8")
  c.init.hf_dir = hf_dir
  c.train.learning_rate, c.train.warmup_steps = 3e-3, 3
  c.train.log_every, c.train.eval_batches, c.train.progress_bar = 5, 2, False
  return c


@pytest.mark.integration
def test_training_starts_from_the_checkpoint_weights(byte_checkpoints):
  hf_dir = byte_checkpoints("qwen3_moe")
  config = init_from.resolve_config(finetune_config("qwen3_moe", hf_dir))
  _, state, optimizer = init_state(config)
  start = init_from.initial_state(config, state, optimizer)
  theirs = import_hf(hf_dir)
  for a, b in zip(
    jax.tree.leaves((start.params, start.rest)), jax.tree.leaves((theirs.params, theirs.rest))
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(start.step) == 0


@pytest.mark.integration
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_finetune_30_steps_then_export_matches_transformers(family, byte_checkpoints, tmp_path):
  workdir = str(tmp_path / "run")
  run = train_and_evaluate(
    finetune_config(family, byte_checkpoints(family)), workdir, write_metrics=False
  )
  losses = [r["loss"] for r in run.history]
  assert len(losses) == 6 and losses[-1] < losses[0] - 0.5, losses

  loaded, _, _ = load_model(workdir=workdir)
  assert loaded.config.family == family
  out = str(tmp_path / "hf_out")
  export_hf(loaded.config, loaded.params, loaded.rest, out)
  assert_export_matches(loaded, out)


@pytest.mark.integration
def test_a_directory_of_another_family_is_refused_before_anything_is_written(
  byte_checkpoints, tmp_path
):
  config = finetune_config("mixtral", byte_checkpoints("qwen3_moe"))
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=r"holds a qwen3_moe model.*model\.family='mixtral'"):
    train_and_evaluate(config, str(workdir))
  assert not os.path.exists(workdir)
  config.init.hf_dir = str(tmp_path / "missing")
  with pytest.raises(ConfigError, match=r"init\.hf_dir=.*missing"):
    train_and_evaluate(config, str(workdir))
