"""The calibrated Bayesian MoE for continual VQA (ICML 2026, abstract only) on the
Sort-of-CLEVR style stream: utility routing with an entropy bonus and Bayesian model
averaging against hard task-id routing, utility routing without the entropy (lambda = 0)
and the true task (moejax/continual/bayesian_vqa.py).

Arms name a routing of bayesian_vqa.ROUTINGS (`routing`, the arm's name by default).
Draw d is seed settings.seed + d: the stream's scenes and questions, the backbone
pretrained on its own split; one training per draw (the backbone, one LoRA expert per
task) scores every arm, so the arms differ only in routing (their pairing key is the
digest of the stream and the backbone). Settings: VQASetup's fields, the seed and the
`tasks` (question types, in stream order). Metrics: final_accuracy, forgetting, ece,
native_mass, routing_entropy, non_native_better (the same for every arm of a draw).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

METRICS = (
  "final_accuracy",
  "forgetting",
  "ece",
  "native_mass",
  "routing_entropy",
  "non_native_better",
)


def setup_defaults() -> dict:
  from moejax.continual.bayesian_vqa import VQASetup

  return {f.name: f.default for f in dataclasses.fields(VQASetup)}


@SCORERS.register("bayesian_vqa")
class BayesianVQA(Scorer):
  settings = {
    "seed": 0,
    "tasks": ["shape", "left", "top", "nearest", "count"],
    **setup_defaults(),
  }
  arm_settings = {"routing": None}

  def __init__(self, spec):
    super().__init__(spec)
    self.cache: tuple[int, tuple] | None = None

  def metrics(self):
    return METRICS

  def choice(self, name: str) -> str:
    return self.spec.arm(name)["routing"] or name

  def setup(self):
    from moejax.continual.bayesian_vqa import VQASetup

    return VQASetup(**{k: self.settings[k] for k in setup_defaults()})

  def check(self) -> None:
    from moejax.continual.bayesian_vqa import ROUTINGS
    from moejax.data.sort_of_clevr import QUESTION_TYPES

    seed = self.settings["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
      raise ConfigError(f"study.settings.seed={seed!r} must be an integer >= 0")
    tasks = self.settings["tasks"]
    if (
      not isinstance(tasks, list)
      or len(tasks) < 2
      or len(set(tasks)) != len(tasks)
      or any(t not in QUESTION_TYPES for t in tasks)
    ):
      raise ConfigError(
        f"study.settings.tasks={tasks!r} must list 2 or more distinct question types of "
        f"{', '.join(QUESTION_TYPES)}"
      )
    self.setup().check(prefix="study.settings")
    for i, (name, _) in enumerate(self.spec.arms):
      if self.choice(name) not in ROUTINGS:
        raise ConfigError(
          f"study.arms[{i}].routing={self.choice(name)!r} (arm {name!r}) must be one of "
          f"{', '.join(ROUTINGS)}"
        )

  def draw(self, draw: int) -> tuple:
    """(seed, backbone, stream data, pairing key) of draw `draw` (cached)."""
    from moejax.continual import bayesian_vqa as bv

    if self.cache is None or self.cache[0] != draw:
      seed = self.settings["seed"] + draw
      backbone, data = bv.prepared_draw(self.setup(), seed, tuple(self.settings["tasks"]))
      weights = jax.tree.leaves(nnx.state(backbone, nnx.Param))
      arrays = [a for split in ("train", "test") for pair in data[split] for a in pair]
      key = digest(*arrays, *[np.asarray(w) for w in weights])
      self.cache = draw, (seed, backbone, data, key)
    return self.cache[1]

  def score(self, level, draw, arms):
    from moejax.continual.bayesian_vqa import run_stream

    seed, backbone, data, key = self.draw(draw)
    routings = sorted({self.choice(name) for name in arms})
    result = run_stream(self.setup(), data, backbone, seed, routings)
    out: dict[str, dict] = {}
    for name in arms:
      own = {**result[self.choice(name)], "non_native_better": result["non_native_better"]}
      out[name] = {metric: float(own[metric]) for metric in METRICS}
      out[name][PAIRING] = key
    return out

  def notes(self, results):
    """The metrics no claim tests, mean ± std over draws."""
    return report.unclaimed_summaries(self.spec, results["runs"], METRICS)
