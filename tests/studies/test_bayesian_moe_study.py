"""The calibrated Bayesian MoE study (configs/studies/bayesian_moe.py,
moejax/studies/scorers/bayesian_vqa.py) through the runner at a tiny size: each arm's
figures equal a direct run of moejax/continual/bayesian_vqa.py on the draw's documented
seed, the oracle arm routes every row to its own expert, every claim is evaluated; bad
settings are refused in one line before any run."""

import importlib

import pytest

from moejax.continual import bayesian_vqa as bv
from moejax.errors import ConfigError
from moejax.studies import runner

TINY = {
  "seed": 5, "tasks": ["shape", "left"], "train_rows": 24, "memory": 8, "test_rows": 8,
  "pretrain_rows": 32, "d_model": 16, "layers": 1, "heads": 2, "head_dim": 8, "d_ff": 16,
  "rank": 2, "pretrain_steps": 2, "steps_per_task": 2, "batch": 8, "router_steps": 5,
}  # fmt: skip


def config(**settings):
  c = importlib.import_module("moejax.configs.studies.bayesian_moe").get_config()
  c.settings = {**TINY, **settings}
  c.draws = 2
  return c


@pytest.mark.integration
def test_the_study_scores_each_routing_as_a_direct_run(tmp_path):
  spec, scorer = runner.prepare(config())
  results = runner.run(spec, scorer, str(tmp_path / "out"), plot=False, log=lambda _: None)
  runs = {(r["arm"], r["draw"]): r["metrics"] for r in results["runs"]}
  assert len(runs) == 8
  assert len(results["claims"]) == len(spec.claims) == 5
  routings = {name: arm["routing"] for name, arm in spec.arms}
  setup = scorer.setup()
  assert setup.train_rows == 24 and setup.lam == 0.25
  backbone, data = bv.prepared_draw(setup, 5 + 1, ("shape", "left"))
  direct = bv.run_stream(setup, data, backbone, 5 + 1)
  for name, routing in routings.items():
    for metric in ("final_accuracy", "forgetting", "ece", "native_mass", "routing_entropy"):
      assert runs[name, 1][metric] == pytest.approx(direct[routing][metric], abs=1e-12)
    assert runs[name, 1]["non_native_better"] == direct["non_native_better"]
  for draw in range(2):
    assert runs["oracle_task", draw]["native_mass"] == 1.0


@pytest.mark.parametrize(
  "settings, arm, names",
  [
    ({"lam": -1.0}, None, ["study.settings.lam=-1.0", ">= 0"]),
    ({"n_bins": 0}, None, ["study.settings.n_bins=0"]),
    ({"memory": 30}, None, ["study.settings.memory=30", "train_rows=24"]),
    ({"tasks": ["shape"]}, None, ["study.settings.tasks=['shape']"]),
    ({"tasks": ["shape", "colour"]}, None, ["study.settings.tasks", "'colour'"]),
    ({"seed": -1}, None, ["study.settings.seed=-1"]),
    ({"width": 3}, None, ["study.settings.width"]),
    ({}, {"name": "x", "routing": "nope"}, ["study.arms[4].routing='nope'", "bayes"]),
  ],
)
def test_bad_settings_are_refused_in_one_line_before_any_run(settings, arm, names):
  c = config(**settings)
  if arm is not None:
    c.arms = [*c.arms, arm]
  with pytest.raises(ConfigError) as error:
    runner.prepare(c)
  message = str(error.value)
  assert "\n" not in message and all(n in message for n in names), message
