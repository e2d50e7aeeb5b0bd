"""Pruning a training workdir end to end (moejax/posttrain/prune_workdir.py): the saved
checkpoint holds exactly the surgery of the source's parameters on the chosen
experts, and experiments.train continues it."""

import jax
import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.posttrain import prune, surgery
from moejax.posttrain.calibration import calibration_windows
from moejax.posttrain.prune_workdir import prune_imported, prune_workdir
from moejax.train.loop import train_and_evaluate
from moejax.train.restore import load_from_workdir
from tests.helpers import TINY_WORKDIR_STEPS as STEPS


@pytest.fixture(scope="module")
def source(tiny_workdir):
  return tiny_workdir


@pytest.mark.integration
def test_pruned_workdir_holds_the_surgery_of_the_source_and_trains_on(source, tmp_path):
  config, workdir = source
  out = str(tmp_path / "pruned")
  report = prune_workdir(workdir, out, keep="0.5", method="frequency", num_windows=8, seed=3)
  kept = {layer["block"]: layer["kept"] for layer in report["layers"]}
  assert report["expert_counts"] == [4, 4] and report["step"] == STEPS
  assert all(
    len(k) == 4 and 0 <= layer["relative_error"] <= 1
    for k, layer in zip(kept.values(), report["layers"])
  )
  src_config, _, params, rest, _ = load_from_workdir(workdir)

  def host(tree):
    return jax.tree.map(np.asarray, tree)

  want_m, want_params, _ = surgery.remove_experts(src_config.model, host(params), host(rest), kept)
  got_config, _, got_params, _, _ = load_from_workdir(out)
  assert got_config.model.moe.num_experts == 4 == want_m.moe.num_experts
  jax.tree.map(np.testing.assert_array_equal, host(got_params), want_params)
  # Fine-tuning continues from the pruned checkpoint, with the source's data position.
  got_config.train.steps = STEPS + 2
  run = train_and_evaluate(got_config, out, write_metrics=False)
  assert run.start_step == STEPS and len(run.history) >= 1
  assert np.all(np.isfinite([r["loss"] for r in run.history]))


@pytest.mark.integration
def test_an_atom_pruned_workdir_holds_the_removal_of_the_kept_atoms_and_trains_on(source, tmp_path):
  """HEAPr at 75% of all atoms: the checkpoint = atoms.remove_atoms of the source on
  the report's per-expert counts, with 3/4 of the atoms live, and it trains on."""
  from moejax.posttrain.measure import expert_parameters

  config, workdir = source
  out = str(tmp_path / "atoms")
  report = prune_workdir(workdir, out, keep="0.75", method="heapr", num_windows=8)
  counts = np.array([layer["kept_atoms"] for layer in report["layers"]])  # [blocks, E]
  assert counts.sum() == round(0.75 * 2 * 8 * 32)
  got_config, _, got_params, _, _ = load_from_workdir(out)
  assert got_config.model.moe.expert_d_ff == min(-(-counts.max() // 8) * 8, 32)
  host = jax.tree.map(np.asarray, got_params)
  _, _, src_params, _, _ = load_from_workdir(workdir)
  assert expert_parameters(host) == 0.75 * expert_parameters(jax.tree.map(np.asarray, src_params))
  for block, row in zip((0, 1), counts):  # kept atoms first, then zero padding
    w_down = host["blocks"][block]["ffn"]["experts"]["w_down"]
    live = np.any(w_down != 0, axis=-1)
    np.testing.assert_array_equal(live.sum(1), row)
    assert all(live[e, :n].all() for e, n in enumerate(row))
  got_config.train.steps = STEPS + 2
  run = train_and_evaluate(got_config, out, write_metrics=False)
  assert run.start_step == STEPS and np.all(np.isfinite([r["loss"] for r in run.history]))


def test_calibration_windows_are_drawn_from_the_stream_by_seed():
  stream = np.arange(1000, dtype=np.int32)
  a = calibration_windows(stream, 5, 16, seed=0)
  assert a.shape == (5, 16)
  np.testing.assert_array_equal(a - a[:, :1], np.tile(np.arange(16), (5, 1)))  # contiguous
  assert a.max() < 1000
  np.testing.assert_array_equal(a, calibration_windows(stream, 5, 16, seed=0))
  assert not np.array_equal(a, calibration_windows(stream, 5, 16, seed=1))
  with pytest.raises(ConfigError, match="fewer than one calibration window of 2000"):
    calibration_windows(stream, 5, 2000, seed=0)


@pytest.mark.parametrize("keep,count", [("0.5", 8), ("0.25", 4), ("1.0", 16), ("6", 6)])
def test_keep_as_fraction_or_count(keep, count):
  assert prune.kept_count(keep, 16, 2) == count


def test_most_similar_kept_expert_by_cosine_of_the_gram():
  z = np.array([[1.0, 0.0], [0.0, 2.0], [0.9, 0.1], [0.1, -1.0], [-1.0, 0.2]])
  merges = prune.most_similar_kept(z @ z.T, [0, 1])
  assert merges == {2: 0, 3: 0, 4: 1}  # 3 is anti-aligned with 1; 4 with 0


def test_an_hf_checkpoint_is_pruned_into_a_converted_workdir(tmp_path):
  """--hf_dir with .npy calibration ids: the converted workdir = the surgery of the
  imported weights on the chosen experts."""
  from moejax.interop.convert import import_hf
  from moejax.train.load import load_model
  from tests.interop.hf_tiny import make_model, save_model

  hf_dir = save_model(make_model("qwen3_moe", vocab_size=256), str(tmp_path / "hf"))
  ids = tmp_path / "ids.npy"
  np.save(ids, np.random.default_rng(0).integers(0, 256, 4096))
  out = str(tmp_path / "pruned")
  report = prune_imported(
    hf_dir=hf_dir,
    workdir=None,
    out=out,
    calibration=str(ids),
    keep="4",
    method="schur_astar",
    num_windows=16,
    context=32,
  )
  assert report["expert_counts"] == [4] * len(report["layers"])
  source = import_hf(hf_dir)
  kept = {layer["block"]: layer["kept"] for layer in report["layers"]}
  _, want, _ = surgery.remove_experts(source.config, source.params, source.rest, kept)
  got, _, _ = load_model(workdir=out)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, got.params), want)
  with pytest.raises(ConfigError, match=r"token id 999 is outside the vocabulary \[0, "):
    np.save(ids, np.array([0, 999] * 100))
    prune_imported(
      hf_dir=hf_dir,
      workdir=None,
      out=None,
      calibration=str(ids),
      keep="4",
      method="frequency",
      num_windows=1,
      context=64,
    )
