"""The tiny dense LM (d_ff 64: 8 experts of 8 neurons at E = 8) trained 2 steps, as
a workdir and as host arrays: the source every conversion test starts from."""

import jax
import numpy as np
import pytest

from moejax.train.loop import train_and_evaluate
from moejax.train.restore import load_from_workdir


@pytest.fixture(scope="session")
def dense(tmp_path_factory, tiny_config):
  workdir = str(tmp_path_factory.mktemp("dense"))
  train_and_evaluate(
    tiny_config("dense=True", steps=2, checkpoint_every=2), workdir, write_metrics=False
  )
  config, _, params, rest, _ = load_from_workdir(workdir)

  def host(t):
    return jax.tree.map(np.asarray, t)

  return workdir, config.model, host(params), host(rest)
