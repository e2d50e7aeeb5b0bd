"""The VAPT transfer study (configs/studies/vapt.py, moejax/studies/scorers/vapt_transfer.py,
moejax/continual/prompt_transfer.py) on stand-in images: the added parameters counted
from the tree equal the formulas of the adapters' docstrings, training leaves the
backbone bit-identical (linear: only the head moves; full moves every parameter),
every arm of a seed starts from
one head and sees the same rows, the runner's figures equal a direct run, and bad
settings are refused in one line before any run."""

import importlib

import jax
import numpy as np
import pytest
from flax import nnx

from moejax.continual import prompt_experts as pe
from moejax.continual import prompt_transfer as pt
from moejax.errors import ConfigError
from moejax.studies import runner
from moejax.train import classifier

TINY = {
  "seed": 3, "tasks": ["glyph_families", "textures"], "d_model": 16, "layers": 2, "heads": 2,
  "head_dim": 8, "d_ff": 16, "image_size": 8, "patch_size": 2, "num_tokens": 3,
  "pretrain_steps": 2, "pretrain_batch": 8, "steps": 3, "batch": 8,
}  # fmt: skip
SETUP = pt.TransferSetup(
  d_model=16, layers=2, heads=2, head_dim=8, d_ff=16, image_size=8, patch_size=2,
  num_tokens=3, pretrain_steps=2, pretrain_batch=8, pretrain_lr=3e-3, steps=3, batch=8,
  lr=1e-2, full_lr=1e-3,
)  # fmt: skip


def params(module, wanted=nnx.Param):
  return {
    jax.tree_util.keystr(path): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(module, wanted))
  }


def stand_in_task(name, seed, side, data_dir=None):
  from moejax.data.vision_streams import transfer_task

  rng = np.random.default_rng([seed, len(name)])
  n = transfer_task(name).num_classes
  return {
    "train_images": rng.random((40, side, side, 1), np.float32),
    "train_labels": (np.arange(40) % n).astype(np.int32),
    "test_images": rng.random((30, side, side, 1), np.float32),
    "test_labels": (np.arange(30) % n).astype(np.int32),
  }


def stand_in_pretraining(side, data_dir=None):
  rng = np.random.default_rng(0)
  return rng.random((48, side, side, 1), np.float32), (np.arange(48) % 6).astype(np.int32)


def backbone(seed=0):
  return pt.VisionTransformer(pt.model_config(SETUP, 6), rngs=nnx.Rngs(seed))


def test_added_parameters_from_the_tree_are_the_docstring_formulas():
  d, layers, n, k, h = 16, 2, 3, 2, 8  # vapt.py's defaults: kernel 2, no padding, MLP 8
  cells = (8 // 2 - k + 1) ** 2  # the 4x4 patch grid after a valid 2x2 convolution: 3x3
  by_formula = {
    "linear": 0,
    # every parameter of the model but its 5-class head (kernel d x 5 and bias)
    "full": sum(
      np.size(x) for x in params(pt.fresh_model("full", SETUP, backbone(), 5, 0)).values()
    )
    - (d * 5 + 5),
    "vpt_shallow": n * d,
    "vpt_deep": layers * n * d,
    "vapt": layers * (2 * d + k * k + cells * n + n) + 2 * d * h,  # 388
  }
  counted = {
    arm: pt.added_parameters(pt.fresh_model(arm, SETUP, backbone(), 5, 0), arm) for arm in pt.ARMS
  }
  assert counted == by_formula and by_formula["vapt"] == 388


PROMPT = nnx.All(nnx.Param, nnx.PathContains("prompt"))


@pytest.mark.parametrize("arm", [arm for arm in pt.ARMS if arm != "full"])
def test_training_an_arm_moves_its_head_and_adapter_and_nothing_of_the_backbone(arm):
  frozen = backbone()
  data = stand_in_task("textures", 0, 8)
  start = pt.fresh_model(arm, SETUP, frozen, 5, 0)
  rows = pt.batch_rows(0, 0, 40, SETUP.steps, SETUP.batch)
  model = pt.adapted(arm, SETUP, frozen, data["train_images"], data["train_labels"], rows, 5, 5, 0)
  kept, source = params(model, pe.BACKBONE), params(frozen, pe.BACKBONE)
  assert kept.keys() == source.keys() and len(kept) > 10
  for key, value in kept.items():
    np.testing.assert_array_equal(value, source[key], err_msg=key)
  for wanted in (pt.HEAD, PROMPT):
    before, after = params(start, wanted), params(model, wanted)
    assert before.keys() == after.keys()
    assert all(not np.array_equal(after[k], before[k]) for k in after), sorted(after)
  assert (len(params(model, PROMPT)) == 0) == (arm == "linear")
  total = len(params(model))
  assert total == len(kept) + len(params(model, pt.HEAD)) + len(params(model, PROMPT))


def test_full_fine_tuning_moves_every_parameter_at_its_own_rate(monkeypatch):
  frozen = backbone()
  data = stand_in_task("textures", 0, 8)
  start = pt.fresh_model("full", SETUP, frozen, 5, 0)
  rows = pt.batch_rows(0, 0, 40, SETUP.steps, SETUP.batch)
  rates = []
  adam = pt.adapt_optimizer
  monkeypatch.setattr(pt, "adapt_optimizer", lambda lr: rates.append(lr) or adam(lr))
  x, y = data["train_images"], data["train_labels"]
  model = pt.adapted("full", SETUP, frozen, x, y, rows, 5, 5, 0)
  before, after = params(start), params(model)
  assert before.keys() == after.keys() and not params(model, PROMPT)
  assert all(not np.array_equal(after[k], before[k]) for k in after), sorted(after)
  assert rates == [SETUP.full_lr]


def test_every_arm_starts_from_one_head_and_trains_on_the_same_rows(monkeypatch):
  calls: list[list] = []  # run_transfer's order: tasks outer, arms inner
  heads: dict[str, dict] = {}
  fresh = pt.fresh_model

  def recording_fresh_model(arm, *args):
    model = fresh(arm, *args)
    heads[arm] = params(model, pt.HEAD)
    return model

  def recording_steps(model, wanted, optimizer, batches):
    calls.append([(np.asarray(x), np.asarray(y)) for x, y, _ in batches])
    return model

  monkeypatch.setattr(pt, "fresh_model", recording_fresh_model)
  monkeypatch.setattr(classifier, "trained_steps", recording_steps)
  names = ("textures", "digits_8x8")
  tasks = {name: (n, stand_in_task(name, 5, 8)) for name, n in zip(names, (5, 10))}
  scores = pt.run_transfer(pt.ARMS, SETUP, backbone(), tasks, seed=5)
  assert len(calls) == 2 * len(pt.ARMS) and set(scores) == set(pt.ARMS)
  for t, name in enumerate(names):
    rows = pt.batch_rows(5, t, 40, SETUP.steps, SETUP.batch)
    data = tasks[name][1]
    for a in range(len(pt.ARMS)):
      batches = calls[t * len(pt.ARMS) + a]
      assert len(batches) == SETUP.steps
      for step, (x, y) in enumerate(batches):
        np.testing.assert_array_equal(x, data["train_images"][rows[step]])
        np.testing.assert_array_equal(y, data["train_labels"][rows[step]])
  assert not np.array_equal(*(pt.batch_rows(5, t, 40, 3, 8) for t in (0, 1)))
  for head in heads.values():
    for key, value in head.items():
      np.testing.assert_array_equal(value, heads["linear"][key])
  for arm in pt.ARMS:  # the head has 10 outputs; textures is scored on its first 5
    assert scores[arm]["mean_accuracy"] == pytest.approx(
      (scores[arm]["accuracy_textures"] + scores[arm]["accuracy_digits_8x8"]) / 2
    )


def config(**settings):
  c = importlib.import_module("moejax.configs.studies.vapt").get_config()
  c.settings = {**TINY, **settings}
  c.draws = 2
  return c


def refused(c, names):
  with pytest.raises(ConfigError) as error:
    runner.prepare(c)
  message = str(error.value)
  assert "\n" not in message and all(n in message for n in names), message


@pytest.mark.parametrize(
  "settings, arm, names",
  [
    ({}, {"name": "x", "method": "vpt_wide"}, ["study.arms[5].method='vpt_wide'", "vapt"]),
    ({}, {"name": "lora"}, ["study.arms[5].method='lora'"]),
    ({"tasks": ["textures", "cifar"]}, None, ["study.settings.tasks[1]='cifar'", "mnist_digits"]),
    ({"tasks": ["textures", "textures"]}, None, ["study.settings.tasks[1]='textures'", "twice"]),
    ({"tasks": []}, None, ["study.settings.tasks=[]"]),
    ({"patch_size": 3}, None, ["study.settings.patch_size=3", "image_size=8"]),
    ({"patch_size": 8}, None, ["study.settings.patch_size=8"]),
    ({"num_tokens": 0}, None, ["study.settings.num_tokens=0"]),
    ({"lr": 0}, None, ["study.settings.lr=0"]),
    ({"full_lr": -1e-3}, None, ["study.settings.full_lr=-0.001"]),
    ({"steps": 1.5}, None, ["study.settings.steps=1.5"]),
  ],
)
def test_bad_vapt_settings_are_refused_in_one_line_before_any_run(settings, arm, names):
  c = config(**settings)
  if arm is not None:
    c.arms = [*c.arms, arm]
  refused(c, names)


def test_mnist_without_its_tarball_is_refused_naming_the_fetch_command(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  monkeypatch.setenv("MOEJAX_MIX_SOURCES", str(tmp_path / "sources"))
  refused(config(tasks=["mnist_digits"]), ["mnist", "fetch_mix_sources.sh"])


@pytest.mark.integration
def test_the_vapt_study_runs_and_its_figures_are_a_direct_run(tmp_path, monkeypatch):
  monkeypatch.setattr(pt, "task_data", stand_in_task)
  monkeypatch.setattr(pt, "pretraining_data", stand_in_pretraining)
  monkeypatch.setattr(runner.report, "plot", None)  # the scorer draws its own
  spec, scorer = runner.prepare(config())
  results = runner.run(spec, scorer, str(tmp_path / "out"), log=lambda _: None)
  assert (tmp_path / "out" / "results.png").stat().st_size > 0
  runs = {(r["arm"], r["draw"]): r["metrics"] for r in results["runs"]}
  assert len(runs) == 2 * len(pt.ARMS) and len(results["claims"]) == 4
  setup = scorer.setup()
  for draw in range(2):
    seed = 3 + draw
    frozen = pt.pretrain_backbone(setup, *stand_in_pretraining(8), seed)
    tasks = {
      name: (n, stand_in_task(name, seed, 8))
      for name, n in (("glyph_families", 5), ("textures", 5))
    }
    direct = pt.run_transfer(pt.ARMS, setup, frozen, tasks, seed)
    for arm in pt.ARMS:
      for metric, value in direct[arm].items():
        assert runs[arm, draw][metric] == pytest.approx(value, abs=1e-12), (arm, metric)
  params_claim = next(c for c in results["claims"] if c["metric"] == "added_params")
  assert params_claim["verdict"] == "opposite direction"  # at d=16, N=3: 388 > 96
