"""The tiny LM trained for a few steps in a training workdir: the source the
workdir-level post-training tests (pruning, compression) start from; and the tiny
MoE trained on a bigram chain that the pruning scores are checked on."""
import os

import pytest

from moejax.configs import lm_shakespeare_moe
from moejax.train.loop import train_and_evaluate

SOURCE_STEPS = 4


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
  """(config, workdir) of the tiny MoE LM after SOURCE_STEPS steps, checkpointed."""
  config = lm_shakespeare_moe.get_config("size=tiny")
  config.data.data_dir = str(tmp_path_factory.mktemp("tfds"))
  config.train.steps, config.train.checkpoint_every = SOURCE_STEPS, SOURCE_STEPS
  config.train.eval_batches, config.train.progress_bar = 1, False
  workdir = str(tmp_path_factory.mktemp("source"))
  train_and_evaluate(config, workdir, write_metrics=False)
  return config, workdir


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory):
  """trained_tiny.trained(): the tiny MoE trained on a bigram chain, trained once for
  all the run's worker processes (in the directory they share) and loaded by the rest."""
  from tests.posttrain.trained_tiny import trained
  shared = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):  # one process of `pytest -n`: its run's directory
    shared = shared.parent
  return trained(str(shared))
