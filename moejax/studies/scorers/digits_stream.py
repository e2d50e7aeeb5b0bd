"""The shared part of the prompt-expert studies on the class-incremental digits stream
(moejax/continual/prompt_experts.py): SMoPE's (smope.py) and FlyPrompt's
(flyprompt.py) scorers.

Draw d is seed settings.seed + d: the training rows split in half, a backbone
pretrained on one half's rotations, the class order shuffled into tasks of
settings.classes_per_task classes; every arm of a draw trains on that stream from
that backbone (their pairing key is the digest of the class order and the backbone).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.studies import report
from moejax.studies.scoring import Scorer, digest

STREAM_INTEGERS = (
  "seed",
  "classes_per_task",
  "d_model",
  "layers",
  "heads",
  "head_dim",
  "d_ff",
  "blocks",
  "pretrain_steps",
  "steps_per_task",
  "batch",
)
MAY_BE_ZERO = ("seed", "blocks", "warmup")
STREAM_SETTINGS = {  # the stream, the backbone and the training schedule
  "seed": 0,
  "classes_per_task": 2,
  "d_model": 64,
  "layers": 4,
  "heads": 4,
  "head_dim": 16,
  "d_ff": 128,
  "blocks": 0,
  "pretrain_steps": 400,
  "pretrain_lr": 3e-3,
  "steps_per_task": 100,
  "batch": 32,
  "lr": 1e-2,
}


class DigitsStream(Scorer):
  """A scorer whose draws are prepared digits streams; a subclass declares its settings
  (the stream's, STREAM_INTEGERS, lr and pretrain_lr, plus its own) and the arm setting
  `arm_key` that names what an arm runs (the arm's name by default), one of
  `choices()`."""

  integer_settings: tuple[str, ...] = STREAM_INTEGERS
  arm_key = "method"

  def choices(self) -> tuple[str, ...]:
    raise NotImplementedError

  def choice(self, name: str) -> str:
    """What arm `name` runs: its `arm_key` setting, or its name."""
    return self.spec.arm(name)[self.arm_key] or name

  def __init__(self, spec):
    super().__init__(spec)
    self.cache: tuple[int, tuple] | None = None

  def setup_values(self) -> dict:
    """The values of prompt_experts.Setup's fields (the settings of the same names)."""
    return dict(self.settings)

  def setup(self):
    from moejax.continual.prompt_experts import Setup

    values = self.setup_values()
    return Setup(**{f.name: values[f.name] for f in dataclasses.fields(Setup)})

  def check(self) -> None:
    s = self.settings
    self.check_integers({key: int(key not in MAY_BE_ZERO) for key in self.integer_settings})
    self.check_numbers(("lr", "pretrain_lr"), positive=True)
    if 10 % s["classes_per_task"]:
      raise ConfigError(
        f"study.settings.classes_per_task={s['classes_per_task']} must divide the 10 digits"
      )
    valid = self.choices()
    for i, (name, _) in enumerate(self.spec.arms):
      if self.choice(name) not in valid:
        raise ConfigError(
          f"study.arms[{i}].{self.arm_key}={self.choice(name)!r} (arm {name!r}) must be "
          f"one of {', '.join(valid)}"
        )

  def tasks(self) -> int:
    return 10 // self.settings["classes_per_task"]

  def draw(self, draw: int) -> tuple:
    """(seed, (backbone, stream data, tasks), pairing key) of draw `draw` (cached)."""
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

  def notes(self, results):
    """The metrics no claim tests (SMoPE: the head's accuracy and forgetting, the prompt
    parameters, the key matching's task accuracy), mean ± std over draws."""
    return report.unclaimed_summaries(self.spec, results["runs"], self.metrics())
