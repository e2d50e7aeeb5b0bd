"""VAPT (arXiv 2501.18936) against full fine-tuning, VPT-shallow, VPT-deep and a linear
probe on the few-shot transfer suite (moejax/continual/prompt_transfer.py, vision_streams.py).

Arms name a method of prompt_transfer.ARMS (`method`, the arm's name by default).
Draw d is seed settings.seed + d: the backbone pretrained on the glyphs' train split
with that seed, each task's 1,000 training rows and batches drawn from it; every arm
of a draw starts from that backbone and one head initialisation and trains on those
batches (the pairing key is the digest of the backbone's weights and each task's
rows and batches). Metrics: mean_accuracy (over settings.tasks), accuracy_<task>
per task, added_params (the parameters an arm trains besides the head, from the
trees: the adapter's, or the whole backbone's for full; the same on every draw).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from moejax.errors import ConfigError, choice_error
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

TASKS = ("mnist_digits", "glyph_characters", "glyph_families", "textures", "digits_8x8")
INTEGERS = (
  "seed",
  "d_model",
  "layers",
  "heads",
  "head_dim",
  "d_ff",
  "image_size",
  "patch_size",
  "num_tokens",
  "pretrain_steps",
  "pretrain_batch",
  "steps",
  "batch",
)
VAPT_KERNEL = 2  # moejax/adapters/vapt.py's default kernel side: the grid must hold it


@SCORERS.register("vapt_transfer")
class VAPTTransfer(Scorer):
  settings = {
    "seed": 0,
    "tasks": list(TASKS),
    "d_model": 64,
    "layers": 4,
    "heads": 4,
    "head_dim": 16,
    "d_ff": 128,
    "image_size": 20,
    "patch_size": 4,
    "num_tokens": 10,
    "pretrain_steps": 600,
    "pretrain_batch": 64,
    "pretrain_lr": 3e-3,
    "steps": 200,
    "batch": 32,
    "lr": 1e-2,
    "full_lr": 1e-3,  # full fine-tuning's (our choice: a tenth of the adapters')
  }
  arm_settings = {"method": None}

  def tasks(self) -> list[str]:
    tasks = self.settings["tasks"]
    return [t for t in tasks if isinstance(t, str)] if isinstance(tasks, list) else []

  def metrics(self):
    return ("mean_accuracy", "added_params", *(f"accuracy_{t}" for t in self.tasks()))

  def method(self, name: str) -> str:
    return self.spec.arm(name)["method"] or name

  def check(self) -> None:
    from moejax.continual import prompt_transfer

    s = self.settings
    self.check_integers({key: int(key != "seed") for key in INTEGERS})
    self.check_numbers(("lr", "full_lr", "pretrain_lr"), positive=True)
    tasks = s["tasks"]
    if not isinstance(tasks, list) or not tasks:
      raise ConfigError(f"study.settings.tasks={tasks!r} must be a non-empty list of task names")
    for i, task in enumerate(tasks):
      if task not in TASKS:
        raise choice_error(f"study.settings.tasks[{i}]", task, TASKS)
      if task in tasks[:i]:
        raise ConfigError(f"study.settings.tasks[{i}]={task!r} is listed twice")
    if s["image_size"] % s["patch_size"] or s["image_size"] // s["patch_size"] < VAPT_KERNEL:
      raise ConfigError(
        f"study.settings.patch_size={s['patch_size']} must divide study.settings.image_size="
        f"{s['image_size']} into a grid of at least {VAPT_KERNEL}x{VAPT_KERNEL} patches"
      )
    for i, (name, _) in enumerate(self.spec.arms):
      if self.method(name) not in prompt_transfer.ARMS:
        raise ConfigError(
          f"study.arms[{i}].method={self.method(name)!r} (arm {name!r}) must be one of "
          f"{', '.join(prompt_transfer.ARMS)}"
        )
    prompt_transfer.check_sources(tasks)

  def setup(self):
    from moejax.continual.prompt_transfer import TransferSetup

    return TransferSetup(
      **{f.name: self.settings[f.name] for f in dataclasses.fields(TransferSetup)}
    )

  def score(self, level, draw, arms):
    from moejax.continual import prompt_transfer as pt
    from moejax.data.vision_streams import transfer_task

    s, seed = self.setup(), self.settings["seed"] + draw
    images, labels = pt.pretraining_data(s.image_size)
    backbone = pt.pretrain_backbone(s, images, labels, seed)
    tasks = {
      name: (transfer_task(name).num_classes, pt.task_data(name, seed, s.image_size))
      for name in self.tasks()
    }
    weights = [np.asarray(w) for w in jax.tree.leaves(nnx.state(backbone, nnx.Param))]
    shared = [
      a
      for i, (_, data) in enumerate(tasks.values())
      for a in (
        data["train_labels"],
        data["test_labels"],
        pt.batch_rows(seed, i, len(data["train_labels"]), s.steps, s.batch),
      )
    ]
    key = digest(*weights, *shared)
    methods = {name: self.method(name) for name in arms}
    scores = pt.run_transfer(list(dict.fromkeys(methods.values())), s, backbone, tasks, seed)
    return {name: {**scores[method], PAIRING: key} for name, method in methods.items()}

  def notes(self, results):
    """The metrics no claim tests (the per-task accuracies), mean ± std over draws."""
    return report.unclaimed_summaries(self.spec, results["runs"], self.metrics())

  def plot(self, results, path) -> bool:
    """Test accuracy per task and over the tasks, one bar per arm (mean over draws,
    95% t-interval); each arm's added parameters in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from moejax.evaluation import stats

    by_key = report.index_runs(results["runs"])
    columns = [*self.tasks(), "mean"]
    arms = self.spec.arm_names
    fig, ax = plt.subplots(figsize=(1.6 * len(columns) + 2, 4))
    width = 0.8 / len(arms)
    for a, arm in enumerate(arms):
      means, errors = [], []
      for column in columns:
        metric = "mean_accuracy" if column == "mean" else f"accuracy_{column}"
        found = list(report.values(self.spec, by_key, arm, {}, metric).values())
        interval = stats.t_interval(found) if found else None
        means.append(interval.mean if interval else np.nan)
        errors.append(interval.hi - interval.mean if interval and interval.hi is not None else 0)
      params = report.values(self.spec, by_key, arm, {}, "added_params")
      label = f"{arm} ({int(next(iter(params.values()), 0))} added)"
      xs = np.arange(len(columns)) + (a - (len(arms) - 1) / 2) * width
      ax.bar(xs, means, width, yerr=errors, capsize=2, label=label, color=f"C{a % 10}")
    ax.set_xticks(np.arange(len(columns)), columns, fontsize=8)
    ax.set(ylabel="test accuracy", ylim=(0, 1))
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{self.spec.name}: mean over {self.spec.draws} draws, 95% t-interval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
