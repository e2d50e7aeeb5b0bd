"""Two processes on 127.0.0.1 (jax.distributed, 4 simulated CPU devices each)
train 3 steps (of 5) through experiments/train.py on the data=2 x expert=4 mesh
with the same losses as this process on one device (the reference;
multidevice/on8_training.py shows one process on that mesh equals it too);
process 0 alone writes the metrics, and the checkpoint they write together
restores (here, on one device) to the reference's parameters. The children are
killed when the test fails or times out."""

import json
import os
import time

import jax
import ml_collections
import numpy as np
import pytest

from moejax.train.checkpoint import Checkpointer
from moejax.train.loop import init_state, train_and_evaluate
from moejax.train.sweep import load_config_file
from tests.sharding import subprocesses

pytestmark = pytest.mark.multidevice  # child processes; runs first (tests/conftest.py)

STEPS, STOP = 5, 3
CONFIG = "configs/lm_shakespeare_moe.py:size=tiny"
TRAIN = dict(steps=STEPS, log_every=1, progress_bar=False)


def train_args(workdir, data_dir, *extra):
  return [
    "-m",
    "experiments.train",
    f"--config={CONFIG}",
    f"--workdir={workdir}",
    f"--config.data.data_dir={data_dir}",
    "--config.mesh.data=2",
    "--config.mesh.expert=4",
    *(f"--config.train.{key}={value}" for key, value in TRAIN.items()),
    f"--stop_at_step={STOP}",
    *extra,
  ]


def train_on_one_device(workdir, data_dir):
  """The reference: the same config and steps in this (1-device) process."""
  config = load_config_file(os.path.join(subprocesses.REPO, CONFIG))
  config.data.data_dir = data_dir
  config.train.update(TRAIN)
  train_and_evaluate(config, str(workdir), stop_at_step=STOP)


def losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == list(range(1, STOP + 1))  # written once
  return [r["loss"] for r in records]


def wait_all(procs, timeout):
  deadline = time.monotonic() + timeout
  while any(p.poll() is None for p in procs):
    if time.monotonic() > deadline:
      pytest.fail(f"processes still running after {timeout} s")
    time.sleep(0.2)
  return [p.returncode for p in procs]


@pytest.mark.integration
def test_two_processes_match_one_device(tmp_path):
  data_dir = str(tmp_path / "tfds")
  train_on_one_device(tmp_path / "single", data_dir)

  port = subprocesses.free_port()
  commands = [
    train_args(
      tmp_path / "multi",
      data_dir,
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={i}",
    )
    for i in range(2)
  ]
  with subprocesses.started(commands, 4, str(tmp_path)) as procs:
    codes = wait_all(procs, timeout=600)
  logs = "\n".join(
    f"--- process {i}\n" + subprocesses.tail(str(tmp_path / f"{i}.log")) for i in range(2)
  )
  assert codes == [0, 0], logs
  assert losses(tmp_path / "multi") == pytest.approx(losses(tmp_path / "single"), rel=1e-5)
  multi, single = (restored_params(tmp_path / name) for name in ("multi", "single"))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), multi, single)


def restored_params(workdir):
  """The step-STOP checkpoint of `workdir` restored in this (1-device) process."""
  ckpt = Checkpointer(str(workdir), 5)
  config = ml_collections.ConfigDict(ckpt.read_meta(STOP)["config"])
  state, _ = ckpt.restore(STOP, jax.tree.map(np.asarray, init_state(config)[1]))
  ckpt.close()
  return jax.tree.map(np.asarray, state.params)
