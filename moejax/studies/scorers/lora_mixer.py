"""Attention-adapter studies on a pretrained base (LoRA-Mixer, arXiv 2507.00029v2):
every arm fine-tunes the same frozen base from its config, every draw is a seed.

Draw d first trains the base (settings.base_config + settings.base_overrides, seed d,
settings.base_steps) in settings.workdir/base/seed_<d> and converts it to a model
directory there (converted/, moejax/interop/convert.py), then trains each arm (a
config file plus overrides, as the 'training' scorer) from it with init.hf_dir set
to that directory: the arms of a draw share the base, its seed and the batches, so
they pair by draw. Finished runs are read back, not re-run (moejax/train/sweep.py).

Metrics: the run's val_bpb and val_loss, and moejax/analysis/adapter_tasks.py's
per-task figures (loss/<k>, accuracy/<k>, task_loss, task_accuracy), the adapter's
expert-task mutual information (mi_bits, mean over blocks and adapted projections) and
the trainable parameter count (trainable_params). The tasks (settings.tasks):
'polyglot', polyglot-synth's num_tasks languages on the eval split (k = 0, 1, ...), or
a list of mix domains, each scored on the first settings.heldout_bytes_per_domain bytes
of its held-out documents (k = the domain).
"""

from __future__ import annotations

import os

from moejax.errors import ConfigError
from moejax.studies import report
from moejax.studies.scorers.training import Training, _strings
from moejax.studies.scoring import SCORERS
from moejax.train import sweep


@SCORERS.register("lora_mixer")
class AdapterOnBase(Training):
  settings = {
    **Training.settings,
    "base_config": "configs/polyglot_synth.py",
    "base_overrides": [],
    "base_steps": 300,
    "num_tasks": 4,
    "tasks": "polyglot",
  }

  def task_names(self) -> list:
    tasks = self.settings["tasks"]
    return list(range(self.settings["num_tasks"])) if tasks == "polyglot" else list(tasks)

  def base_dir(self, draw: int) -> str:
    return os.path.join(self.settings["workdir"], "base", f"seed_{self.seed(draw)}")

  def draw_overrides(self, draw: int) -> list[str]:
    return [f"init.hf_dir={os.path.join(self.base_dir(draw), 'converted')}"]

  def base_config(self, draw: int):
    try:
      return sweep.run_config(
        self.settings["base_config"],
        list(self.settings["base_overrides"]),
        seed=self.seed(draw),
        steps=self.settings["base_steps"],
      )
    except ConfigError as e:
      raise ConfigError(f"study.settings.base_config: {e}") from None

  def metrics(self):
    tasks = self.task_names()
    return (
      ("val_bpb", "val_loss", "task_loss", "task_accuracy", "mi_bits", "trainable_params")
      + tuple(f"loss/{k}" for k in tasks)
      + tuple(f"accuracy/{k}" for k in tasks)
    )

  def check(self):
    _strings(self.settings["base_overrides"], "study.settings.base_overrides")
    n, tasks = self.settings["num_tasks"], self.settings["tasks"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise ConfigError(f"study.settings.num_tasks={n!r} must be an int >= 1")
    if tasks != "polyglot":
      from moejax.data.mix import DOMAINS

      _strings(tasks, "study.settings.tasks")
      unknown = sorted(set(tasks) - set(DOMAINS))
      if not tasks or unknown or len(set(tasks)) != len(tasks):
        raise ConfigError(
          f"study.settings.tasks={list(tasks)!r} must be 'polyglot' or distinct mix "
          f"domains among {', '.join(DOMAINS)}"
        )
      if self.settings["heldout_bytes_per_domain"] <= 0:
        raise ConfigError(
          "study.settings.heldout_bytes_per_domain must be > 0 to score mix domains"
        )
    self.base_config(0)
    super().check()
    for arm in self.spec.arm_names:
      data = self.config(arm, self.spec.levels[0], 0).data
      if tasks != "polyglot":
        if data.name != "mix":
          raise ConfigError(
            f"arm {arm!r} trains on data.name={data.name!r}; the study scores mix domains"
          )
      elif data.name != "polyglot_synth" or data.polyglot.num_languages != n:
        raise ConfigError(
          f"arm {arm!r} trains on data.name={data.name!r} with "
          f"{data.polyglot.num_languages} languages; the study scores "
          f"study.settings.num_tasks={n} polyglot_synth languages"
        )

  def prepare_base(self, draw: int) -> None:
    """Train draw `draw`'s base (or read it back) and write its converted directory."""
    from moejax.interop.convert import is_converted_workdir, save_workdir
    from moejax.train.load import from_training_workdir

    base = self.base_dir(draw)
    sweep.train_run(self.base_config(draw), base, train_fn=self.train_fn)
    converted = os.path.join(base, "converted")
    if not is_converted_workdir(converted):
      save_workdir(converted, from_training_workdir(base)[0])

  def score(self, level, draw, arms):
    from moejax.analysis.adapter_tasks import mix_task_report, task_report

    self.prepare_base(draw)
    out = {}
    for arm in arms:
      run_dir = self.run_dir(arm, level, draw)
      result = sweep.train_run(self.config(arm, level, draw), run_dir, train_fn=self.train_fn)
      tasks = self.settings["tasks"]
      report = (
        task_report(run_dir)
        if tasks == "polyglot"
        else mix_task_report(run_dir, tasks, self.settings["heldout_bytes_per_domain"])
      )
      figures = {**result, **report}
      out[arm] = {k: float(figures[k]) for k in self.metrics() if k in figures}
    return out

  def notes(self, results):
    return report.unclaimed_summaries(self.spec, results["runs"], self.metrics(), level=3)
