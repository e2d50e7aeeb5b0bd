"""The `distillation` scorer (moejax/studies/scorers/distillation.py) with stand-in
training and held-out figures: every logit-reading distilled arm trains with the
study's teacher and again with the misleading overrides, the cross-entropy arm and
hidden-state KD (which reads no teacher logits) once; the loss metrics are the
hand-computed differences; bad settings are refused before any run."""

import ml_collections
import pytest

from moejax.data.mix import DOMAINS
from moejax.errors import ConfigError
from moejax.train import sweep
from tests.studies.fake_training import FakeTrain, run

CONFIG = "configs/distill.py"
RISE = {"kl": 0.5, "residual": 0.125}  # bpb a misleading teacher adds on the corrupted domain


def fake_heldout(run_dir, config, bytes_per_domain):
  """bpb 2 + 0.01 * domain index + seed; + RISE[method] on code when the teacher misleads."""
  method = config.distill.method if config.task == "distill" else "ce"
  corrupted = set(filter(None, config.distill.corrupt_domains.split(",")))
  out = {"heldout_bpb": 2.0 + config.seed, "heldout_bytes": bytes_per_domain}
  for i, d in enumerate(DOMAINS):
    out[f"heldout_bpb/{d}"] = (
      2.0 + 0.01 * i + config.seed + (RISE.get(method, 0.0) if d in corrupted else 0.0)
    )
  return out


def study(workdir, **settings):
  c = ml_collections.ConfigDict()
  c.name, c.scorer, c.draws, c.reference = "tiny_distillation", "distillation", 2, "ce"
  c.settings = {
    "workdir": str(workdir),
    "steps": 2,
    "heldout_bytes_per_domain": 64,
    "domains": list(DOMAINS),
    "teacher": "runs/zoo/s_seed7",
    "misleading": ["distill.corrupt_domains=code"],
    "corrupted": ["code"],
    **settings,
  }
  c.arms = [
    {"name": name, "config": f"{CONFIG}:method={method}"}
    for name, method in (
      ("ce", "none"),
      ("kl", "kl"),
      ("hidden", "hidden"),
      ("residual", "residual"),
    )
  ]
  c.claims = [
    {
      "arm": "residual",
      "reference": "kl",
      "metric": "loss_corrupted",
      "expect": "lower",
      "text": "residual loses less",
    }
  ]
  return c


def test_each_distilled_arm_trains_twice_and_the_losses_are_the_differences(tmp_path, monkeypatch):
  monkeypatch.setattr(sweep, "heldout_figures", fake_heldout)
  fake, teachers = FakeTrain(tmp_path / "runs"), []
  original = fake.__call__

  def train(config, run_dir):
    teachers.append(config.distill.teacher.workdir)
    return original(config, run_dir)

  results = run(study(tmp_path / "runs"), tmp_path / "out", train)
  assert fake.calls == [
    f"{arm}/{where}seed_{seed}"
    for seed in (0, 1)
    for arm, where in [
      ("ce", ""),
      ("kl", ""),
      ("hidden", ""),
      ("residual", ""),
      ("kl", "teacher=misleading/"),
      ("residual", "teacher=misleading/"),
    ]
  ]
  assert set(teachers) == {"runs/zoo/s_seed7"}
  for r in results["runs"]:
    m = r["metrics"]
    rise = RISE.get(r["arm"], 0.0)
    assert m["loss/code"] == pytest.approx(rise) and m["loss_corrupted"] == pytest.approx(rise)
    assert m["loss_other"] == pytest.approx(0.0) and m["loss/drama"] == pytest.approx(0.0)
    assert m["misleading/heldout_bpb/code"] == pytest.approx(m["heldout_bpb/code"] + rise)
  (claim,) = results["claims"]
  assert claim["interval"]["mean"] == pytest.approx(RISE["residual"] - RISE["kl"])


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(teacher=""), r"study\.settings\.teacher=''"),
    (dict(misleading=[]), r"study\.settings\.misleading=\[\]"),
    (dict(corrupted=["poetry"]), r"study\.settings\.corrupted=\['poetry'\]"),
    (dict(misleading=["distill.corrupt_domain=code"]), r"no config key 'distill\.corrupt_domain'"),
  ],
)
def test_bad_settings_are_refused_before_any_run(tmp_path, change, message):
  fake = FakeTrain(tmp_path / "runs")
  with pytest.raises(ConfigError, match=message):
    run(study(tmp_path / "runs", **change), tmp_path / "out", fake)
  assert fake.calls == []
