"""RandOpt on zoo checkpoints through pretraining (Neural Thickets, arXiv 2603.12228;
moejax/ensembles/): at each level (`step`, a checkpoint of the training workdir;
`task`, arithmetic or next_passage), N perturbations of the checkpoint scored on a
selection set, the top K voting on a disjoint held-out set (ensembles/thickets.py).

Arms: base (the checkpoint), perturbations (the N members: their mean accuracy, and
the fraction `improving` on the base on the selection set, `improving_held_out` on
the held-out set), best_single (the top-1 member by selection accuracy) and
topk_vote (the majority vote of the top K). Metrics: accuracy (held out) and
selection_accuracy. Draw d: the probe examples drawn with seed d and the members'
noise from PRNGKey(d); every arm of a draw is scored on the same examples (their
digest is the pairing key). Both tasks of one (step, draw) share one scoring pass.
"""

from __future__ import annotations

import functools

import jax

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

ARMS = ("base", "perturbations", "best_single", "topk_vote")


@SCORERS.register("randopt")
class RandOpt(Scorer):
  settings = {
    "workdir": "runs/zoo/s",
    "n": 32,
    "k": 5,
    "sigma": 0.1,
    "chunk": 8,
    "width": 1,
    "per_domain": 4,
    "per_size": 8,
    "passage": 32,
    "bytes_per_domain": 65536,
  }
  arm_settings = {}
  WORKDIR = "study.settings.workdir"

  def metrics(self):
    return ("accuracy", "selection_accuracy", "improving", "improving_held_out")

  def check(self) -> None:
    from moejax.ensembles import randopt, thickets
    from moejax.posttrain.source import check_workdir
    from moejax.train.checkpoint import Checkpointer

    s = self.settings
    for key in ("n", "k", "chunk", "width", "per_domain", "per_size", "passage"):
      if not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < 1:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be an integer >= 1")
    randopt.check(
      s["n"], s["k"], float(s["sigma"]), {k: f"study.settings.{k}" for k in ("n", "k", "sigma")}
    )
    unknown = [a for a in self.spec.arm_names if a not in ARMS]
    if unknown:
      raise ConfigError(
        f"study.arms: {unknown[0]!r} is not an arm of scorer 'randopt'; arms: {', '.join(ARMS)}"
      )
    if sorted(self.spec.axes) != ["step", "task"]:
      raise ConfigError(f"study.levels must give the axes step and task, not {self.spec.axes}")
    check_workdir(s["workdir"], self.WORKDIR, kinds=("training", "mixed"))
    ckpt = Checkpointer(s["workdir"], read_only=True)
    steps = ckpt.all_steps()
    ckpt.close()
    for j, level in enumerate(self.spec.levels):
      if level["step"] not in steps:
        raise ConfigError(
          f"study.levels[{j}].step={level['step']!r} is not a checkpoint of "
          f"{self.WORKDIR}={s['workdir']}; it holds {list(steps)}"
        )
      if level["task"] not in thickets.TASKS:
        raise ConfigError(
          f"study.levels[{j}].task={level['task']!r}; valid: {', '.join(thickets.TASKS)}"
        )

  @functools.lru_cache(maxsize=1)
  def _pass(self, step: int, draw: int):
    """(tasks, Scored, pairing) of checkpoint `step` at draw `draw` (both tasks)."""
    from moejax.data.pipeline import split_documents
    from moejax.ensembles import thickets
    from moejax.evaluation import harness
    from moejax.train.restore import restore

    s = self.settings
    r = restore(s["workdir"], step)
    documents = harness.sample_documents(split_documents(r.config.data), s["bytes_per_domain"])
    examples = thickets.split_examples(
      documents, draw, per_domain=s["per_domain"], per_size=s["per_size"], passage=s["passage"]
    )
    tasks = thickets.encode(examples, r.tokenizer, r.tokenizer.eos_id, r.config.data.seq_len)
    scored = thickets.score(
      r.graphdef,
      r.params,
      r.rest,
      tasks,
      n=s["n"],
      sigma=float(s["sigma"]),
      key=jax.random.PRNGKey(draw),
      chunk=s["chunk"],
      width=s["width"],
    )
    pairing = digest(*[t.inputs for pair in tasks.values() for t in pair])
    return tasks, scored, pairing

  def score(self, level, draw, arms):
    from moejax.ensembles import thickets

    tasks, scored, pairing = self._pass(level["step"], draw)
    found = thickets.outcome(tasks, scored, level["task"], self.settings["k"])
    return {arm: {**found[arm], PAIRING: pairing} for arm in arms}

  def improving(self, results: dict, level: dict, metric: str):
    """(Wilson interval, hits, total) of `metric` pooled over every model and draw, or None."""
    n = self.settings["n"]
    found = list(
      report.values(
        self.spec, report.index_runs(results["runs"]), "perturbations", level, metric
      ).values()
    )
    if not found:
      return None
    hits = int(round(sum(v * n for v in found)))
    return stats.wilson(hits, n * len(found)), hits, n * len(found)

  def notes(self, results: dict) -> str:
    """The improving fractions with Wilson intervals, pooled over models and draws."""
    n = self.settings["n"]
    rows = []
    for level in self.spec.levels:
      cells = []
      for metric in ("improving", "improving_held_out"):
        found = self.improving(results, level, metric)
        cells.append(
          "—"
          if found is None
          else f"{found[0].mean:.3f} [{found[0].lo:.3f}, {found[0].hi:.3f}] ({found[1]}/{found[2]})"
        )
      rows.append([level["step"], level["task"], *cells])
    table = stats.markdown_table(
      ["step", "task", "improving (selection) [Wilson 95%]", "improving (held out) [Wilson 95%]"],
      rows,
    )
    return (
      "## Fraction of perturbations that improve on the base\n\nPooled over every "
      f"model and draw ({n} perturbations each); Wilson 95% intervals.\n\n{table}"
    )

  def plot(self, results: dict, path: str) -> bool:
    """Left: the improving fractions per task against the step (Wilson 95%, pooled);
    right: held-out accuracy of each arm on next_passage (mean over models, t 95%)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps = sorted({level["step"] for level in self.spec.levels})
    tasks = sorted({level["task"] for level in self.spec.levels})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (task, metric) in enumerate(
      (t, m) for t in tasks for m in ("improving", "improving_held_out")
    ):
      found = [self.improving(results, {"step": s, "task": task}, metric) for s in steps]
      if any(f is None for f in found):
        continue
      mean = np.array([f[0].mean for f in found])
      err = np.clip(
        [[f[0].mean - f[0].lo for f in found], [f[0].hi - f[0].mean for f in found]], 0, None
      )
      left.errorbar(
        steps,
        mean,
        yerr=err,
        marker="o",
        capsize=3,
        color=f"C{i}",
        linestyle="-" if metric == "improving" else "--",
        label=f"{task}, {'selection' if metric == 'improving' else 'held out'}",
      )
    left.set(
      xscale="log",
      xlabel="training step",
      ylabel="fraction of perturbations",
      title="perturbations that beat the base (Wilson 95%)",
    )
    left.legend(fontsize=7)
    by_key = report.index_runs(results["runs"])
    for a, arm in enumerate(self.spec.arm_names):
      means, spans = [], []
      for s in steps:
        level = {"step": s, "task": "next_passage"}
        by_unit = report.values(self.spec, by_key, arm, level, "accuracy")
        per_model = report.model_means(self.spec, list(by_unit), list(by_unit.values()))
        interval = stats.t_interval(per_model) if len(per_model) else None
        means.append(np.nan if interval is None else interval.mean)
        spans.append(
          0.0 if interval is None or interval.hi is None else interval.hi - interval.mean
        )
      right.errorbar(
        np.array(steps) * (1 + 0.03 * a),
        means,
        yerr=spans,
        marker="o",
        capsize=3,
        color=f"C{a}",
        label=arm,
      )
    right.set(
      xscale="log",
      xlabel="training step",
      ylabel="held-out accuracy",
      title="next_passage: arms (mean over models, t 95%)",
    )
    right.legend(fontsize=7)
    fig.suptitle(
      f"RandOpt on {len(self.spec.models)} model(s), N={self.settings['n']}, "
      f"K={self.settings['k']}, sigma={self.settings['sigma']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
