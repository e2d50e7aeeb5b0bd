"""Distillation studies: every arm is a student config trained (the `training`
scorer's runs) once with the teacher as it is and once with a misleading teacher.

Settings, beside the `training` scorer's: `teacher` (a training workdir, set as
distill.teacher.workdir on every arm), `misleading` (the overrides that corrupt the
teacher, e.g. ["distill.corrupt_domains=code"]) and `corrupted` (the domains they
corrupt). An arm whose config is not task='distill' (the cross-entropy student)
has no teacher, and one whose method reads no teacher logits (hidden-state KD) is not
reached by the misleading teacher, whose overrides corrupt only logits: each trains
once, and its misleading figures are its normal ones (no evidence on robustness).
The misleading run of an arm goes to settings.workdir/<arm>/teacher=misleading/.

Metrics: the `training` scorer's (held-out bpb per domain, teacher as it is),
misleading/heldout_bpb[/<domain>] (the same with the misleading teacher),
loss/<domain> = misleading minus normal held-out bpb, and loss_corrupted /
loss_other, the mean loss over the corrupted domains and over the rest.
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError
from moejax.studies import report
from moejax.studies.scorers.training import Training, _strings
from moejax.studies.scoring import SCORERS

CONDITION = "teacher"  # the run-directory key of the misleading runs


@SCORERS.register("distillation")
class Distillation(Training):
  settings = {**Training.settings, "teacher": "", "misleading": [], "corrupted": []}

  def config(self, arm: str, level: dict, draw: int):
    """The arm's config with the study's teacher; misleading at level teacher=misleading."""
    level = dict(level)
    extra = {"distill.teacher.workdir": self.settings["teacher"]}
    if level.pop(CONDITION, None) == "misleading":
      for item in self.settings["misleading"]:
        key, _, value = item.partition("=")
        extra[key] = value
    return super().config(arm, {**level, **extra}, draw)

  def misled(self, arm: str) -> bool:
    """Whether the misleading teacher reaches the arm (module doc)."""
    from moejax.distill.objectives import DISTILL_METHODS

    config = self.config(arm, {}, 0)
    if config.task != "distill":
      return False
    return "logits" in DISTILL_METHODS.get(config.distill.method).teacher_keys

  def metrics(self):
    domains = self.settings["domains"]
    return (
      super().metrics()
      + ("misleading/heldout_bpb",)
      + tuple(f"misleading/heldout_bpb/{d}" for d in domains)
      + tuple(f"loss/{d}" for d in domains)
      + ("loss_corrupted", "loss_other")
    )

  def check(self):
    super().check()
    s = self.settings
    if not isinstance(s["teacher"], str) or not s["teacher"]:
      raise ConfigError(f"study.settings.teacher={s['teacher']!r} must name a training workdir")
    _strings(s["misleading"], "study.settings.misleading")
    if not s["misleading"]:
      raise ConfigError("study.settings.misleading=[] must hold the overrides that corrupt it")
    unknown = sorted(set(s["corrupted"]) - set(s["domains"]))
    if not s["corrupted"] or unknown:
      raise ConfigError(
        f"study.settings.corrupted={s['corrupted']!r} must be a non-empty subset of "
        f"study.settings.domains={s['domains']!r}"
      )
    for arm in self.spec.arm_names:  # every misleading config builds, before any run
      self.config(arm, {CONDITION: "misleading"}, 0)

  def score(self, level, draw, arms):
    normal = super().score(level, draw, arms)
    taught = {arm: settings for arm, settings in arms.items() if self.misled(arm)}
    misleading = super().score({**level, CONDITION: "misleading"}, draw, taught)
    out = {}
    for arm, figures in normal.items():
      wrong = misleading.get(arm, figures)
      row = dict(figures)
      row["misleading/heldout_bpb"] = wrong["heldout_bpb"]
      losses = {}
      for d in self.settings["domains"]:
        row[f"misleading/heldout_bpb/{d}"] = wrong[f"heldout_bpb/{d}"]
        losses[d] = wrong[f"heldout_bpb/{d}"] - figures[f"heldout_bpb/{d}"]
        row[f"loss/{d}"] = losses[d]
      corrupted = set(self.settings["corrupted"])
      row["loss_corrupted"] = float(np.mean([v for d, v in losses.items() if d in corrupted]))
      row["loss_other"] = float(np.mean([v for d, v in losses.items() if d not in corrupted]))
      out[arm] = row
    return out

  def notes(self, results):
    runs, lines = results["runs"], []
    claimed = set(report.claimed_metrics(self.spec))
    for prefix in ("misleading/heldout_bpb/", "loss/"):
      for metric in [m for m in self.metrics() if m.startswith(prefix) and m not in claimed]:
        lines += [f"### {metric}", "", report.summary_table(self.spec, runs, metric), ""]
    return "\n".join(lines) + "\n" + super().notes(results)
