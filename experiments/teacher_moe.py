r"""teacher-MoE regression: train a top-1 MoE student on a known
gated teacher and report test MSE over the noise floor and matched purity.

  python -m experiments.teacher_moe --steps=6000 --learning_rate=1e-2 [--json=out.json]

Defaults: d 8, 4 teacher and student experts (SwiGLU width 16), noise std 0.1 of
the clean output std (moejax/analysis/teacher_moe.py).
"""

import dataclasses
import json

from absl import flags

from moejax import cli, cli_files
from moejax.analysis import teacher_moe

_STEPS = cli.checked(flags.DEFINE_integer("steps", 2000, "Training steps."), cli.at_least(1))
_LR = cli.checked(
  flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate."),
  cli.in_range(0, float("inf"), low_open=True),
)
_EXPERTS = cli.checked(
  flags.DEFINE_integer("student_experts", 4, "Student experts."), cli.at_least(1)
)
_SEEDS = cli.checked(flags.DEFINE_list("teacher_seeds", ["0"], "Teacher seeds."), cli.at_least(0))
_JSON = flags.DEFINE_string("json", None, "Also write the figures here.")


def main(argv):
  del argv
  cli_files.output_file("json", _JSON.value)
  settings = dataclasses.replace(
    teacher_moe.Settings(), steps=_STEPS.value, learning_rate=_LR.value
  )
  rows = []
  for seed in map(int, _SEEDS.value):
    result = teacher_moe.train_student(
      settings, teacher_seed=seed, num_experts=_EXPERTS.value, log=print
    )
    rows.append({"teacher_seed": seed, **result})
    print(json.dumps(rows[-1]), flush=True)
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(
        {"settings": dataclasses.asdict(settings), "student_experts": _EXPERTS.value, "runs": rows},
        f,
        indent=1,
      )


if __name__ == "__main__":
  cli.run(main)
