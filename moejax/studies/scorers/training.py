"""Training studies: every arm is a config trained from scratch, every draw a seed.

An arm is a config file (`config`, "configs/file.py[:arg]") plus dotted overrides
(`overrides`, "key=value" as --config.key=value would set it); settings.common adds
overrides to every arm and settings.steps is every run's budget. Draw d trains with
seed settings.seeds[d] (seed d when seeds is empty): the seed fixes initialisation,
data order and step keys, so on draw d every arm sees the same batches and the arms
pair by draw. A level, if the study has levels, is more overrides: {dotted key: value}.

Each (arm, level, draw) trains once, in settings.workdir/<arm>[/<level>]/seed_<s>, with
moejax.train.loop.train_and_evaluate (moejax.train.sweep.train_run: an interrupted run
resumes from its checkpoint; a finished one, same config, is read back, not re-run).
Metrics: the run's summary (sweep.summarize: final val bpb and loss, median tokens/s,
parameters, MoE figures over the last quarter of the log) and, with
settings.heldout_bytes_per_domain > 0, the evaluation harness's bpb on the first N
bytes of every domain of the eval split (heldout_bpb, heldout_mi_bits: I(domain;
top-1 expert), mean over MoE layers, and heldout_bpb/<domain> for each domain named in
settings.domains, which must be the split's domains). A figure a run does not have
(e.g. routing figures of a dense model) is left out, not stored as NaN.
"""

from __future__ import annotations

import math
import os

import numpy as np

from moejax import cli_files
from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies import report
from moejax.studies.scoring import SCORERS, Scorer
from moejax.train import sweep

RESERVED = ("seed", "train.steps")  # set by the draw and settings.steps
FIGURES = (
  ("tokens_per_second", "tokens/s", "{:,.0f}"),
  ("params", "params", "{:,.0f}"),
  ("max_over_mean_load", "max/mean load", "{:.3f}"),
  ("routing_entropy", "routing entropy (nats)", "{:.3f}"),
  ("dropped_fraction", "dropped", "{:.3f}"),
  ("padding_waste", "padding waste", "{:.3f}"),
)


def _strings(value, key: str) -> list[str]:
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    raise ConfigError(f"{key}={value!r} must be a list of 'key=value' strings")
  for item in value:
    if item.partition("=")[0] in RESERVED:
      raise ConfigError(
        f"{key} sets {item.partition('=')[0]!r}; the draw sets the seed "
        "and study.settings.steps the budget"
      )
  return value


@SCORERS.register("training")
class Training(Scorer):
  settings = {
    "workdir": "",
    "steps": 600,
    "seeds": [],
    "common": [],
    "heldout_bytes_per_domain": 0,
    "domains": [],
  }
  arm_settings = {"config": "", "overrides": []}
  train_fn = None  # None: moejax.train.loop.train_and_evaluate (tests pass a stand-in)

  def seed(self, draw: int) -> int:
    return self.settings["seeds"][draw] if self.settings["seeds"] else draw

  def draw_overrides(self, draw: int) -> list[str]:
    """Overrides every arm of draw `draw` gets (none here; a subclass may give some, e.g.
    the draw's pretrained model)."""
    return []

  def config(self, arm: str, level: dict, draw: int):
    """The run's config; a ConfigError names the arm (or the level) it came from."""
    i = self.spec.arm_names.index(arm)
    settings = self.spec.arm(arm)
    extra = [f"{k}={v}" for k, v in level.items()] + self.draw_overrides(draw)
    try:
      return sweep.run_config(
        settings["config"],
        list(self.settings["common"]) + list(settings["overrides"]) + extra,
        seed=self.seed(draw),
        steps=self.settings["steps"],
      )
    except ConfigError as e:
      where = f" at level {report.level_label(level)}" if level else ""
      raise ConfigError(f"study.arms[{i}] (arm {arm!r}){where}: {e}") from None

  def run_dir(self, arm: str, level: dict, draw: int) -> str:
    parts = [self.settings["workdir"], arm]
    if level:
      parts.append(",".join(f"{k}={v}" for k, v in level.items()))
    return os.path.join(*parts, f"seed_{self.seed(draw)}")

  def metrics(self):
    heldout = (
      sweep.HELDOUT + tuple(f"heldout_bpb/{d}" for d in self.settings["domains"])
      if self.settings["heldout_bytes_per_domain"]
      else ()
    )
    return sweep.SUMMARY + heldout

  def _check_settings(self) -> None:
    s = self.settings
    if not isinstance(s["workdir"], str) or not s["workdir"]:
      raise ConfigError(
        f"study.settings.workdir={s['workdir']!r} must name the directory the runs go to"
      )
    for key, low in (("steps", 1), ("heldout_bytes_per_domain", 0)):
      if not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < low:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be an integer >= {low}")
    _strings(s["common"], "study.settings.common")
    if not isinstance(s["domains"], list) or not all(isinstance(d, str) for d in s["domains"]):
      raise ConfigError(f"study.settings.domains={s['domains']!r} must be a list of domain names")
    if s["domains"] and not s["heldout_bytes_per_domain"]:
      raise ConfigError(
        "study.settings.domains needs study.settings.heldout_bytes_per_domain "
        "> 0 (the per-domain figures are the held-out ones)"
      )
    if s["seeds"]:
      try:
        seeds = sweep.check_seeds(s["seeds"])
      except ConfigError as e:
        raise ConfigError(f"study.settings.{e}") from None
      if len(seeds) < self.spec.draws:
        raise ConfigError(
          f"study.settings.seeds={list(seeds)} has {len(seeds)} seeds for "
          f"study.draws={self.spec.draws}"
        )
    for i, (name, arm) in enumerate(self.spec.arms):
      if not isinstance(arm["config"], str) or not arm["config"]:
        raise ConfigError(
          f"study.arms[{i}].config={arm['config']!r} (arm {name!r}) must be "
          "a config file, 'configs/file.py[:arg]'"
        )
      _strings(arm["overrides"], f"study.arms[{i}].overrides (arm {name!r})")
      if "/" in name or name.startswith("."):
        raise ConfigError(f"study.arms[{i}].name={name!r} names a run directory: no '/'")

  def check(self):
    self._check_settings()
    kind = cli_files.workdir_kind(self.settings["workdir"])
    if kind in ("file", "training", "converted", "mixed"):
      raise ConfigError(
        f"study.settings.workdir={self.settings['workdir']!r} must be a "
        f"directory of runs (one per arm), not a {kind} path"
      )
    for level in self.spec.levels:  # every config builds, before any run
      for arm in self.spec.arm_names:
        self.config(arm, level, 0)

  def score(self, level, draw, arms):
    out = {}
    for arm in arms:
      result = sweep.train_run(
        self.config(arm, level, draw),
        self.run_dir(arm, level, draw),
        heldout_bytes_per_domain=self.settings["heldout_bytes_per_domain"],
        train_fn=self.train_fn,
      )
      found = sorted(k.partition("/")[2] for k in result if k.startswith("heldout_bpb/"))
      if self.settings["domains"] and found != sorted(self.settings["domains"]):
        raise ConfigError(
          f"study.settings.domains={self.settings['domains']} but the eval "
          f"split of arm {arm!r} has domains {found}"
        )
      out[arm] = {
        k: float(result[k])
        for k in self.metrics()
        if isinstance(result.get(k), (int, float)) and math.isfinite(result[k])
      }
    return out

  def notes(self, results):
    runs, lines = results["runs"], []
    claimed = set(report.claimed_metrics(self.spec))
    for metric in [m for m in self.metrics() if m.startswith("heldout_bpb/")]:
      if metric not in claimed:
        lines += [f"### {metric}", "", report.summary_table(self.spec, runs, metric), ""]
    by_key = report.index_runs(runs)
    rows = []
    for level in self.spec.levels:
      for arm in self.spec.arm_names:
        cells = []
        for key, _, fmt in FIGURES:
          found = [
            v for v in report.values(self.spec, by_key, arm, level, key).values() if v is not None
          ]
          cells.append(fmt.format(np.mean(found)) if found else "—")
        rows.append([*level.values(), arm, *cells])
    lines += [
      "### Training figures (mean over draws)",
      "",
      stats.markdown_table([*self.spec.axes, "arm", *(t for _, t, _ in FIGURES)], rows),
    ]
    return "\n".join(lines)

  def plot(self, results, path):
    runs = [(r["arm"], self.run_dir(r["arm"], r["level"], r["draw"])) for r in results["runs"]]
    return sweep.plot_curves(runs, path)
