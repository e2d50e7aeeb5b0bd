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
  settings = {"workdir": "runs/zoo/s", "n": 32, "k": 5, "sigma": 0.1, "chunk": 8,
              "width": 1, "per_domain": 4, "per_size": 8, "passage": 32,
              "bytes_per_domain": 65536}
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
    randopt.check(s["n"], s["k"], float(s["sigma"]),
                  {k: f"study.settings.{k}" for k in ("n", "k", "sigma")})
    unknown = [a for a in self.spec.arm_names if a not in ARMS]
    if unknown:
      raise ConfigError(f"study.arms: {unknown[0]!r} is not an arm of scorer 'randopt'; "
                        f"arms: {', '.join(ARMS)}")
    if sorted(self.spec.axes) != ["step", "task"]:
      raise ConfigError(f"study.levels must give the axes step and task, not {self.spec.axes}")
    check_workdir(s["workdir"], self.WORKDIR, kinds=("training", "mixed"))
    ckpt = Checkpointer(s["workdir"], read_only=True)
    steps = ckpt.all_steps()
    ckpt.close()
    for j, level in enumerate(self.spec.levels):
      if level["step"] not in steps:
        raise ConfigError(f"study.levels[{j}].step={level['step']!r} is not a checkpoint of "
                          f"{self.WORKDIR}={s['workdir']}; it holds {list(steps)}")
      if level["task"] not in thickets.TASKS:
        raise ConfigError(f"study.levels[{j}].task={level['task']!r}; valid: "
                          f"{', '.join(thickets.TASKS)}")

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
    examples = thickets.split_examples(documents, draw, per_domain=s["per_domain"],
                                       per_size=s["per_size"], passage=s["passage"])
    tasks = thickets.encode(examples, r.tokenizer, r.tokenizer.eos_id, r.config.data.seq_len)
    scored = thickets.score(r.graphdef, r.params, r.rest, tasks, n=s["n"],
                            sigma=float(s["sigma"]), key=jax.random.PRNGKey(draw),
                            chunk=s["chunk"], width=s["width"])
    pairing = digest(*[t.inputs for pair in tasks.values() for t in pair])
    return tasks, scored, pairing

  def score(self, level, draw, arms):
    from moejax.ensembles import thickets
    tasks, scored, pairing = self._pass(level["step"], draw)
    found = thickets.outcome(tasks, scored, level["task"], self.settings["k"])
    return {arm: {**found[arm], PAIRING: pairing} for arm in arms}

  def notes(self, results: dict) -> str:
    """The improving fractions with Wilson intervals, pooled over models and draws."""
    n = self.settings["n"]
    rows = []
    by_key = report.index_runs(results["runs"])
    for level in self.spec.levels:
      cells = []
      for metric in ("improving", "improving_held_out"):
        found = list(report.values(self.spec, by_key, "perturbations", level, metric).values())
        if not found:
          cells.append("—")
          continue
        hits = int(round(sum(v * n for v in found)))
        interval = stats.wilson(hits, n * len(found))
        cells.append(f"{interval.mean:.3f} [{interval.lo:.3f}, {interval.hi:.3f}] "
                     f"({hits}/{n * len(found)})")
      rows.append([level["step"], level["task"], *cells])
    table = stats.markdown_table(["step", "task", "improving (selection) [Wilson 95%]",
                                  "improving (held out) [Wilson 95%]"], rows)
    return ("## Fraction of perturbations that improve on the base\n\nPooled over every "
            f"model and draw ({n} perturbations each); Wilson 95% intervals.\n\n{table}")
