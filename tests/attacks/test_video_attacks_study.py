"""configs/studies/video_attacks.py end to end on a tiny setting (4-frame 8x8 clips, a
width-16 model, a few steps, 2 draws): every arm of every draw scored once, metrics
in [0, 1], the arms of a draw paired, clean accuracy shared by the standard model's
arms, the figure drawn; bad arms and settings refused before any run."""

import json

import pytest

from moejax.configs.studies import video_attacks  # noqa: F401  (configs/ via its link)
from moejax.errors import ConfigError
from moejax.studies import runner

TINY = {
  "shrink": True,
  "train_videos": 64,
  "test_videos": 8,
  "d_model": 16,
  "heads": 2,
  "head_dim": 8,
  "expert_d_ff": 8,
  "patch": 2,
  "steps": 2,
  "batch": 16,
  "defence_steps": 3,
  "attack_steps": 2,
  "train_attack_steps": 1,
}


# Two attacks on the standard model and one defence (each arm kind once; every arm of
# the study compiles its own attack or training program, which is most of the time).
ARMS = ("pgd", "j_tlga", "j_tlat")


def tiny_config(**changes):
  c = video_attacks.get_config()
  c.settings = {**c.settings, **TINY}
  c.draws = 2
  c.arms = [a for a in c.arms if a["name"] in ARMS]
  c.claims = [k for k in c.claims if {k["arm"], k.get("reference", "pgd")} <= set(ARMS)]
  for key, value in changes.items():
    c[key] = value
  return c


@pytest.mark.integration
def test_the_study_runs_end_to_end(tmp_path):
  spec, scorer = runner.prepare(tiny_config())
  out = str(tmp_path / "out")
  runner.run(spec, scorer, out, stored=runner.check_output(spec, out), log=lambda _: None)
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  arms = list(ARMS)
  assert [(r["arm"], r["draw"]) for r in results["runs"]] == [(a, d) for d in (0, 1) for a in arms]
  for draw in (0, 1):
    runs = [r for r in results["runs"] if r["draw"] == draw]
    assert len({r["pairing"] for r in runs}) == 1
    standard = {r["metrics"]["clean_accuracy"] for r in runs if r["arm"] in arms[:2]}
    assert len(standard) == 1
    for r in runs:
      for metric in ("clean_accuracy", "robust_accuracy_low", "robust_accuracy_high", "flip_rate"):
        assert 0.0 <= r["metrics"][metric] <= 1.0
  assert (tmp_path / "out" / "results.png").stat().st_size > 1000


@pytest.mark.parametrize(
  ("changes", "message"),
  [
    ({"arms": [{"name": "fgsm"}]}, r"study\.arms\[0\]\.attack='fgsm'"),
    ({"arms": [{"name": "x", "defence": "trades", "attack": "pgd"}]}, r"defence='trades'"),
  ],
)
def test_bad_arms_are_refused_before_any_run(changes, message):
  config = tiny_config(**changes)
  config.claims = []
  config.reference = config.arms[0]["name"]
  with pytest.raises(ConfigError, match=message):
    runner.prepare(config)
