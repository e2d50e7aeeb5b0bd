"""Training on the data=2 x expert=4 mesh against one device, and checkpoints
that move between layouts: saved on 2 x 4, restored bitwise on 1 device and on
data=4 x expert=2; on one device training continues with the same losses."""

import os
import shutil

import jax
import numpy as np
import pytest

from moejax import sharding
from moejax.train.checkpoint import Checkpointer
from moejax.train.distributed import make_placement
from moejax.train.loop import build_model, init_state, train_and_evaluate
from tests.sharding.multidevice.common import MESHES, one_device, tiny_config

STEPS, SAVED = 5, 3


def config(data_dir, mesh=None):
  return tiny_config(
    data_dir,
    mesh=mesh,
    steps=STEPS,
    log_every=1,
    checkpoint_every=SAVED,
    eval_batches=1,
    max_to_keep=5,
  )


def losses(*runs):
  return np.array([r["loss"] for run in runs for r in run.history])


def host(tree):
  return jax.tree.map(np.asarray, tree)


def restored_params(workdir, config, devices):
  """Step SAVED of `workdir` restored onto `config`'s mesh over `devices`."""
  layout = sharding.make_layout(config, devices)
  if layout is None:
    target = host(init_state(config)[1])
  else:
    placement = make_placement(config, layout, build_model)
    target = placement.restore_target(jax.eval_shape(placement.init))
  ckpt = Checkpointer(workdir, 5)
  state, _ = ckpt.restore(SAVED, target)
  ckpt.close()
  if layout is not None:
    shardings = jax.tree.leaves(jax.tree.map(lambda a: a.sharding, state.params))
    assert all(s.mesh == layout.mesh for s in shardings)
  return host(state.params)


@pytest.mark.integration
def test_training_on_2x4_equals_one_device_and_resumes_on_other_layouts(data_dir, tmp_path):
  one = train_and_evaluate(
    config(data_dir), str(tmp_path / "one"), write_metrics=False, devices=one_device()
  )
  mesh_2x4 = config(data_dir, MESHES["data2_expert4"])
  first = train_and_evaluate(
    mesh_2x4, str(tmp_path / "2x4"), write_metrics=False, stop_at_step=SAVED
  )
  saved_params = host(first.state.params)
  for name in ("on_one", "on_4x2"):
    shutil.copytree(tmp_path / "2x4", tmp_path / name)
  rest = train_and_evaluate(mesh_2x4, str(tmp_path / "2x4"), write_metrics=False)
  np.testing.assert_allclose(losses(first, rest), losses(one), rtol=1e-5)

  targets = {
    "on_one": (config(data_dir), one_device()),
    "on_4x2": (config(data_dir, dict(data=4, expert=2)), None),
  }
  for name, (target_config, devices) in targets.items():
    workdir = str(tmp_path / name)
    restored = restored_params(workdir, target_config, devices)
    jax.tree.map(np.testing.assert_array_equal, restored, saved_params)
  # Training continues on one device with the 2 x 4 run's losses (continuing on
  # 4 x 2 as well would compile two more 8-device programs: suite budget).
  resumed = train_and_evaluate(
    targets["on_one"][0], str(tmp_path / "on_one"), write_metrics=False, devices=one_device()
  )
  assert resumed.start_step == SAVED
  np.testing.assert_allclose(losses(resumed), losses(rest), rtol=1e-5)


@pytest.mark.integration
def test_an_imported_family_trains_on_2x4_as_on_one_device(data_dir, tmp_path):
  """A tiny DeepSeek-V3 (MLA, shared experts, group-limited routing with its bias
  state) fine-tuned from its HF checkpoint: every parameter carries logical axes,
  so the 2 x 4 mesh with expert parallelism trains it with one device's losses."""
  from moejax.configs import finetune_hf

  hf_dir = os.environ.get("MOEJAX_TEST_DEEPSEEK_V3_HF_DIR")  # written by the parent session
  if hf_dir is None:  # this module run on its own
    from tests.interop.hf_tiny import make_model, save_model

    hf_dir = save_model(make_model("deepseek_v3", vocab_size=256), str(tmp_path / "hf"))

  def finetune(mesh=None):
    c = finetune_hf.get_config("family=deepseek_v3,steps=3,seq_len=16,batch_size=8")
    c.init.hf_dir, c.data.data_dir = hf_dir, data_dir
    c.train.log_every, c.train.eval_batches, c.train.progress_bar = 1, 1, False
    for axis, size in (mesh or {}).items():
      c.mesh[axis] = size
    return c

  one = train_and_evaluate(
    finetune(), str(tmp_path / "one"), write_metrics=False, devices=one_device()
  )
  on_2x4 = train_and_evaluate(
    finetune(MESHES["data2_expert4"]), str(tmp_path / "2x4"), write_metrics=False
  )
  np.testing.assert_allclose(losses(on_2x4), losses(one), rtol=1e-5)
  assert len(losses(one)) == 3
