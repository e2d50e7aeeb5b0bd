"""SMoPE (arXiv 2509.24483) on a class-incremental digits stream against one shared
prompt and task-specific prompts with key matching (moejax/continual/prompt_experts.py).

Arms name a method of prompt_experts.METHODS (`method`, the arm's name by default).
Draws as digits_stream.py says (a backbone pretrained on one half of the training
rows, the stream of the other half in a shuffled class order, arms paired by draw).
Metrics: final_accuracy and forgetting by the nearest class mean, the same by the
head (head_*), prompt_params and, for task_prompts, task_id_accuracy.
"""

from __future__ import annotations

from moejax.errors import ConfigError
from moejax.studies.scorers.digits_stream import STREAM_INTEGERS, STREAM_SETTINGS, DigitsStream
from moejax.studies.scoring import PAIRING, SCORERS

METRICS = (
  "final_accuracy",
  "forgetting",
  "head_final_accuracy",
  "head_forgetting",
  "prompt_params",
  "task_id_accuracy",
)


@SCORERS.register("smope")
class SMoPE(DigitsStream):
  settings = {
    **STREAM_SETTINGS,
    "experts": 10,
    "top_k": 2,
    "warmup": 50,
  }
  arm_settings = {"method": None}
  integer_settings = (*STREAM_INTEGERS, "experts", "top_k", "warmup")

  def metrics(self):
    return METRICS

  def choices(self):
    from moejax.continual.prompt_experts import METHODS

    return METHODS

  def check(self) -> None:
    super().check()
    s = self.settings
    if s["top_k"] > s["experts"]:
      raise ConfigError(
        f"study.settings.top_k={s['top_k']} selects more experts than "
        f"study.settings.experts={s['experts']}"
      )

  def score(self, level, draw, arms):
    from moejax.continual.prompt_experts import run_stream

    seed, (backbone, data, tasks), key = self.draw(draw)
    out: dict[str, dict] = {}
    for name in arms:
      result = run_stream(self.choice(name), self.setup(), backbone, data, tasks, seed)
      out[name] = {metric: float(result[metric]) for metric in METRICS if metric in result}
      out[name][PAIRING] = key
    return out
