"""SMoPE (arXiv 2509.24483) on a class-incremental digits stream against one shared
prompt and task-specific prompts with key matching (moejax/continual/prompt_experts.py).

Arms name a method of prompt_experts.METHODS (`method`, the arm's name by default).
Draw d is seed settings.seed + d: the training rows split in half, a backbone
pretrained on one half's rotations, the class order shuffled into tasks of
settings.classes_per_task classes; every arm of a draw trains on that stream from
that backbone (their pairing key is the digest of the class order and the backbone).
Metrics: final_accuracy and forgetting by the nearest class mean, the same by the
head (head_*), prompt_params and, for task_prompts, task_id_accuracy.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

INTEGER_SETTINGS = (
  "seed",
  "classes_per_task",
  "d_model",
  "layers",
  "heads",
  "head_dim",
  "d_ff",
  "experts",
  "top_k",
  "blocks",
  "pretrain_steps",
  "steps_per_task",
  "warmup",
  "batch",
)
MAY_BE_ZERO = ("seed", "blocks", "warmup")
METRICS = (
  "final_accuracy",
  "forgetting",
  "head_final_accuracy",
  "head_forgetting",
  "prompt_params",
  "task_id_accuracy",
)


@SCORERS.register("smope")
class SMoPE(Scorer):
  settings = {
    "seed": 0,
    "classes_per_task": 2,
    "d_model": 64,
    "layers": 4,
    "heads": 4,
    "head_dim": 16,
    "d_ff": 128,
    "experts": 10,
    "top_k": 2,
    "blocks": 0,
    "pretrain_steps": 400,
    "pretrain_lr": 3e-3,
    "steps_per_task": 100,
    "warmup": 50,
    "batch": 32,
    "lr": 1e-2,
  }
  arm_settings = {"method": None}

  def __init__(self, spec):
    super().__init__(spec)
    self.cache: tuple[int, tuple] | None = None

  def metrics(self):
    return METRICS

  def method(self, name: str) -> str:
    return self.spec.arm(name)["method"] or name

  def setup(self):
    from moejax.continual.prompt_experts import Setup

    s = self.settings
    return Setup(**{f.name: s[f.name] for f in dataclasses.fields(Setup)})

  def check(self) -> None:
    from moejax.continual.prompt_experts import METHODS

    s = self.settings
    for key in INTEGER_SETTINGS:
      low = 0 if key in MAY_BE_ZERO else 1
      if isinstance(s[key], bool) or not isinstance(s[key], int) or s[key] < low:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be an integer >= {low}")
    for key in ("lr", "pretrain_lr"):
      if isinstance(s[key], bool) or not isinstance(s[key], (int, float)) or s[key] <= 0:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be a number > 0")
    if s["top_k"] > s["experts"]:
      raise ConfigError(
        f"study.settings.top_k={s['top_k']} selects more experts than "
        f"study.settings.experts={s['experts']}"
      )
    if 10 % s["classes_per_task"]:
      raise ConfigError(
        f"study.settings.classes_per_task={s['classes_per_task']} must divide the 10 digits"
      )
    for i, (name, _) in enumerate(self.spec.arms):
      if self.method(name) not in METHODS:
        raise ConfigError(
          f"study.arms[{i}].method={self.method(name)!r} (arm {name!r}) must be one of "
          f"{', '.join(METHODS)}"
        )

  def draw(self, draw: int) -> tuple:
    from moejax.continual import prompt_experts

    if self.cache is None or self.cache[0] != draw:
      seed = self.settings["seed"] + draw
      data = prompt_experts.digits()
      prepared = prompt_experts.prepared_draw(
        self.setup(), seed, self.settings["classes_per_task"], data
      )
      backbone, _, tasks = prepared
      weights = jax.tree.leaves(nnx.state(backbone, nnx.Param))
      key = digest(np.asarray(sum(tasks, [])), *[np.asarray(w) for w in weights])
      self.cache = draw, (seed, prepared, key)
    return self.cache[1]

  def score(self, level, draw, arms):
    from moejax.continual.prompt_experts import run_stream

    seed, (backbone, data, tasks), key = self.draw(draw)
    out: dict[str, dict] = {}
    for name in arms:
      result = run_stream(self.method(name), self.setup(), backbone, data, tasks, seed)
      out[name] = {metric: float(result[metric]) for metric in METRICS if metric in result}
      out[name][PAIRING] = key
    return out

  def notes(self, results):
    """The metrics no claim tests: the head's accuracy and forgetting, the prompt
    parameters and the key matching's task accuracy, mean ± std over draws."""
    claimed = report.claimed_metrics(self.spec)
    return "\n\n".join(
      f"## {metric}\n\n{report.summary_table(self.spec, results['runs'], metric)}"
      for metric in METRICS
      if metric not in claimed
    )
