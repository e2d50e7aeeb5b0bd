"""The tiny dense LM (d_ff 64: 8 experts of 8 neurons at E = 8) trained 2 steps, as
a workdir and as host arrays: the source every conversion test starts from."""

import jax
import numpy as np
import pytest

from moejax.configs import lm_shakespeare_moe
from moejax.train.loop import train_and_evaluate
from moejax.train.restore import load_from_workdir


def tiny_dense():
  c = lm_shakespeare_moe.get_config("size=tiny,dense=True")
  c.train.steps, c.train.checkpoint_every, c.train.progress_bar = 2, 2, False
  return c


@pytest.fixture(scope="session")
def dense(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("dense"))
  train_and_evaluate(tiny_dense(), workdir, write_metrics=False)
  config, _, params, rest, _ = load_from_workdir(workdir)

  def host(t):
    return jax.tree.map(np.asarray, t)

  return workdir, config.model, host(params), host(rest)
