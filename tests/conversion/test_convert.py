"""Whole-model dense-to-MoE conversion (moejax/conversion/convert.py) and its command,
experiments.convert_dense, on a tiny dense model (d_ff 64: 8 experts of 8 neurons)."""

import json
import os

import numpy as np
import pytest
from flax import nnx

from moejax.configs import lm_shakespeare_moe
from moejax.conversion import convert, measure, partition, trajectory
from moejax.models.decoder import abstract_model
from moejax.train.loop import train_and_evaluate
from moejax.train.restore import restore
from tests.helpers import training_workdir
from tests.cli.harness import assert_refused, run_entry, tree_hash

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


@pytest.mark.integration
@pytest.mark.parametrize("kind", partition.KINDS)
def test_all_experts_with_unit_gates_give_the_dense_logits(dense, kind):
  """top_k = E and a zero router: weights 1/E, w_down times E: unit gates on every
  expert, the dense model's logits."""
  _, m, params, rest = dense
  tokens = trajectory.generate_trajectories(m, params, rest, 4, 15, seed=0, prefix_id=0)
  xs, dense_logits = trajectory.ffn_inputs_and_logits(m, params, rest, tokens)
  fitted = convert.fit_partitions(kind, m, params, xs, 8, 8, seed=0)
  assert all(np.bincount(labels).tolist() == [8] * 8 for labels, _ in fitted)
  zero = [(labels, np.zeros_like(router)) for labels, router in fitted]
  moe_params = convert.convert_params(params, zero, 8, 8)
  moe = nnx.merge(abstract_model(convert.moe_model(m, 8, 8))[0], moe_params, rest)
  logits = np.asarray(moe(tokens)[0])
  np.testing.assert_allclose(logits, dense_logits, rtol=0, atol=1e-5)
  assert np.abs(dense_logits).max() > 0.1
  # at 3 of 8 the MoE is no longer the dense model (the check can fail)
  moe3 = nnx.merge(
    abstract_model(convert.moe_model(m, 8, 3))[0],
    convert.convert_params(params, fitted, 8, 3),
    rest,
  )
  assert np.abs(np.asarray(moe3(tokens)[0]) - dense_logits).max() > 1e-2


@pytest.mark.integration
def test_trajectory_fit_beats_a_random_partition_on_held_out_trajectories(dense):
  _, m, params, rest = dense
  held = trajectory.generate_trajectories(m, params, rest, 8, 31, seed=99, prefix_id=0)
  scores = {}
  details = []
  for kind in ("random", "trajectory"):
    moe_m, moe_params, fit = convert.convert(
      m, params, rest, kind, 8, 3, seed=0, trajectories=16, length=31, details=details
    )
    assert not np.array_equal(fit[:, 1:9], held[:, 1:9])  # held out: another sample
    scores[kind] = measure.held_out(m, params, rest, moe_m, moe_params, held)
  assert len(details) == m.num_layers and {"coactivation", "keys"} <= set(details[0])
  assert scores["trajectory"]["mse"] < 0.85 * scores["random"]["mse"], scores
  assert scores["trajectory"]["kl"] < 0.85 * scores["random"]["kl"], scores


@pytest.mark.integration
def test_the_command_writes_a_workdir_the_trainer_continues(dense, tmp_path):
  workdir, m, params, _ = dense
  out = str(tmp_path / "moe")
  result = run_entry(
    "experiments.convert_dense",
    f"--workdir={workdir}",
    "--experts=8",
    "--top_k=3",
    "--partition=kmeans_hartigan",
    "--trajectories=4",
    "--length=15",
    f"--out={out}",
  )
  assert result.code in (0, None), result.stderr[-3000:]
  report = json.load(open(os.path.join(out, "conversion.json")))
  assert report["held_out"]["kl"] > 0 and report["train_steps"] == 1  # 10% of 2 steps
  assert report["fitting_mse_by_candidate"] == []  # only the trajectory fit has candidates
  r = restore(out)
  config, moe_params = r.config, r.params
  assert r.step == 0 and config.model.ffn_type == "moe" and config.model.moe.top_k == 3
  w = np.asarray(moe_params["blocks"][0]["ffn"]["experts"]["w_down"])
  assert w.shape == (8, 8, 32)
  # every dense down row appears once, times top_k
  rows = np.sort((w / 3).reshape(64, 32), axis=0)
  np.testing.assert_allclose(
    rows, np.sort(params["blocks"][0]["ffn"]["down"]["kernel"], 0), rtol=1e-6
  )
  config.train.progress_bar = False
  run = train_and_evaluate(config, out, write_metrics=False)
  assert run.start_step == 0 and int(run.state.step) == 1


@pytest.mark.parametrize(
  "args,names",
  [
    (["--experts=8", "--top_k=9"], ["--top_k=9"]),
    (["--experts=5", "--top_k=3"], ["d_ff=64", "--experts=5"]),
    (["--experts=8", "--top_k=3", "moe"], ["ffn_type is 'moe'"]),
    (["--experts=8", "--top_k=3", "inside"], ["--out=", "inside the input --workdir"]),
  ],
)
def test_bad_input_is_refused_in_one_line_before_anything_is_written(dense, tmp_path, args, names):
  workdir = dense[0]
  if "moe" in args:
    args = args[:-1]
    workdir = str(tmp_path / "moe_source")
    training_workdir(workdir, lm_shakespeare_moe.get_config("size=tiny"))
  out = str(tmp_path / "out")
  if "inside" in args:
    args, out = args[:-1], os.path.join(workdir, "converted")
  before = tree_hash(str(tmp_path)), tree_hash(workdir)
  result = run_entry("experiments.convert_dense", f"--workdir={workdir}", *args, f"--out={out}")
  assert_refused(result, *names)
  assert (tree_hash(str(tmp_path)), tree_hash(workdir)) == before
