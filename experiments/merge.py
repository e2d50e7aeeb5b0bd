r"""Merge models: task arithmetic, TIES, Nash bargaining or weight averaging of parameter trees.

  python -m experiments.merge --base=runs/zoo/s --experts=runs/ft/a,runs/ft/b \
      --method=task_arithmetic [--weights=0.5,0.5] [--scale=1.0] --out=runs/merged/ab

--base: the model the task vectors are taken from (a training workdir, a converted
workdir or an HF checkpoint directory, to read); --experts: the models to merge,
comma-separated, each of the same shapes as the base (a differing parameter is
named). --method: task_arithmetic (base + scale * sum_i w_i (theta_i - base)),
ties (trim each task vector to its --density largest magnitudes, elect the sign
of the larger mass, average the agreeing entries), nash (NAMEx's Nash-bargaining
direction: base + scale * G alpha, (G^T G) alpha = 1/alpha) or average
(sum_i w_i theta_i; no base needed). --weights: one per expert, uniform if not
given; average, ties and nash need them on the simplex (non-negative, summing to 1).
--out: the merged model, written as the base is (a training workdir at the base's
step, or a converted workdir), with merge.json. See moejax/merging/ and
moejax/posttrain/merge_workdir.py.
"""

from absl import flags

from moejax import cli
from moejax.merging import MERGE_METHODS, bind
from moejax.posttrain.merge_workdir import merge_models

_BASE = flags.DEFINE_string(
  "base",
  None,
  "The base model to read from: a training or converted workdir, or an HF checkpoint directory.",
)
_EXPERTS = flags.DEFINE_list(
  "experts", None, "The models to read from and merge: workdirs or HF directories, comma-separated."
)
_METHOD = flags.DEFINE_enum(
  "method", "task_arithmetic", list(MERGE_METHODS), "The merge method (moejax/merging/)."
)
_WEIGHTS = cli.checked(
  flags.DEFINE_list(
    "weights", None, "One weight per expert, comma-separated; uniform if not given."
  ),
  cli.in_range(float("-inf"), float("inf")),
  "a finite number",
)
_SCALE = cli.checked(
  flags.DEFINE_float(
    "scale", 1.0, "task_arithmetic, ties and nash: the scale of the merged task vector."
  ),
  cli.in_range(0.0, float("inf"), low_open=True),
)
_DENSITY = cli.checked(
  flags.DEFINE_float("density", 0.2, "ties: the fraction of each task vector's entries kept."),
  cli.in_range(0.0, 1.0, low_open=True),
)
_OUT = flags.DEFINE_string("out", None, "Write the merged workdir here (new or empty).")
flags.mark_flags_as_required(["experts", "out"])


def main(argv):
  del argv
  settings = {
    f.name: f.value
    for f in (_SCALE, _DENSITY)
    if f.present and f.name in dict(MERGE_METHODS.get(_METHOD.value).settings)
  }
  ignored = [f"--{f.name}" for f in (_SCALE, _DENSITY) if f.present and f.name not in settings]
  if ignored:
    raise cli.flag_error(
      flags.FLAGS[ignored[0][2:]], f"--method={_METHOD.value} has no setting {ignored[0]}"
    )
  merge = bind(_METHOD.value, settings)
  weights = None if _WEIGHTS.value is None else [float(w) for w in _WEIGHTS.value]
  report = merge_models(merge, _BASE.value, _EXPERTS.value, weights, _OUT.value)
  print(
    f"{report['method']} of {len(report['experts'])} models "
    f"(weights {', '.join(f'{w:g}' for w in report['weights'])}; settings "
    f"{report['settings']}) -> {_OUT.value}"
  )


if __name__ == "__main__":
  cli.run(main)
