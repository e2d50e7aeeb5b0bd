"""The FlyPrompt study (configs/studies/flyprompt.py, moejax/studies/scorers/flyprompt.py)
through the runner at a tiny setting on stand-in images: the oracle arm routes every
image right, each arm's figures equal a direct run of moejax/continual/flyprompt.py on
the draw's documented seed with the arm's router, every claim is evaluated, a resume of
the finished study keeps its routing picture, and bad settings are refused in one line
before any run."""

import importlib

import numpy as np
import pytest

from moejax.continual import flyprompt as fp
from moejax.continual import prompt_experts as pe
from moejax.errors import ConfigError
from moejax.studies import runner

TINY = {
  "seed": 4, "d_model": 16, "layers": 2, "heads": 2, "head_dim": 8, "d_ff": 16,
  "blocks": 1, "pretrain_steps": 2, "steps_per_task": 2, "batch": 8, "width": 32,
  "ridge": 1.0,
}  # fmt: skip


def stand_in_digits(data_dir=None):
  rng = np.random.default_rng(0)
  train = rng.random((120, 8, 8, 1), np.float32), np.arange(120) % 10
  test = rng.random((40, 8, 8, 1), np.float32), np.arange(40) % 10
  return (*train, *test)


def refused(c, names):
  with pytest.raises(ConfigError) as error:
    runner.prepare(c)
  message = str(error.value)
  assert "\n" not in message and all(n in message for n in names), message


def config(**settings):
  c = importlib.import_module("moejax.configs.studies.flyprompt").get_config()
  c.settings = {**TINY, **settings}
  c.draws = 2
  return c


@pytest.mark.integration
def test_the_flyprompt_study_runs_each_router_on_one_training_per_draw(tmp_path, monkeypatch):
  monkeypatch.setattr(pe, "digits", stand_in_digits)
  spec, scorer = runner.prepare(config())
  out = tmp_path / "out"
  results = runner.run(spec, scorer, str(out), log=lambda _: None)
  picture = (out / runner.PLOT).read_bytes()
  assert {len(matrices) for matrices in scorer.routing.values()} == {2}  # routing by task
  again, resumed = runner.prepare(config())
  runner.run(
    again, resumed, str(out), stored=runner.check_output(again, str(out)), log=lambda _: None
  )
  assert not resumed.routing and (out / runner.PLOT).read_bytes() == picture  # kept
  runs = {(r["arm"], r["draw"]): r["metrics"] for r in results["runs"]}
  assert len(runs) == 10
  routers = {name: arm["router"] for name, arm in spec.arms}
  for draw in range(2):
    assert runs["oracle_task", draw]["routing_accuracy"] == 1.0
    setup = scorer.setup()
    assert setup.experts == 2 * 5 and setup.warmup == 0
    backbone, data, tasks = pe.prepared_draw(setup, 4 + draw, 2, stand_in_digits())
    fly = fp.FlySetup(width=32, ridge=1.0, decays=(0.9, 0.99), blurry=0.1)
    direct = fp.run_flyprompt(setup, fly, backbone, data, tasks, 4 + draw)
    for name, router in routers.items():
      for metric in ("routing_accuracy", "final_accuracy", "auc_accuracy", "forgetting"):
        assert runs[name, draw][metric] == pytest.approx(direct[router][metric], abs=1e-12)
  assert len(results["claims"]) == len(spec.claims) == 6


@pytest.mark.parametrize(
  "settings, arm, names",
  [
    ({"ridge": -1.0}, None, ["study.settings.ridge=-1.0"]),
    ({"width": -3}, None, ["study.settings.width=-3"]),
    ({"decays": [0.9, 1.0]}, None, ["study.settings.decays[1]=1.0", "[0.0, 1.0)"]),
    ({"blurry": 1.0}, None, ["study.settings.blurry=1.0"]),
    ({"prompt_length": 0}, None, ["study.settings.prompt_length=0"]),
    ({"classes_per_task": 3}, None, ["study.settings.classes_per_task=3"]),
    ({}, {"name": "x", "router": "nope"}, ["study.arms[5].router='nope'", "rear"]),
  ],
)
def test_bad_flyprompt_settings_are_refused_in_one_line_before_any_run(settings, arm, names):
  c = config(**settings)
  if arm is not None:
    c.arms = [*c.arms, arm]
  refused(c, names)


@pytest.mark.parametrize(
  "settings, names",
  [
    ({"top_k": 11}, ["study.settings.top_k=11", "study.settings.experts=10"]),
    ({"warmup": -1}, ["study.settings.warmup=-1"]),
    ({"lr": 0}, ["study.settings.lr=0"]),
    ({"classes_per_task": 4}, ["study.settings.classes_per_task=4"]),
  ],
)
def test_the_smope_study_on_the_shared_stream_scorer_still_refuses_bad_settings(settings, names):
  smope = importlib.import_module("moejax.configs.studies.smope")
  c = smope.get_config()
  c.settings = {**c.settings, **settings}
  refused(c, names)
  _, scorer = runner.prepare(smope.get_config())
  assert scorer.setup().experts == 10 and scorer.setup().warmup == 50
