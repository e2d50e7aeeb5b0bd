r"""A polyglot-synth run against its known optimum.

  python -m experiments.train --config=configs/polyglot_synth.py --workdir=runs/polyglot
  python -m experiments.polyglot_report --workdir=runs/polyglot [--json=out.json]
  python -m experiments.polyglot_report --sweep_dir=runs/routers_polyglot [--json=...]

Prints the Bayes floor over exactly the evaluated target tokens
(moejax/data/polyglot.py), the last evaluation's val bpb and its excess over
the floor, the first evaluated step within 5% (and 10%) of the floor, and per
MoE layer NMI(document language, top-1 expert) over the input tokens of the
evaluated windows (expert_index[:, 0] of the latest checkpoint's routing).
--sweep_dir: every ARM/seed_N workdir of a training study (scorer 'training'), then per
arm over its seeds: excess over the floor, steps to within 5%, and NMI
(mean over layers), each as mean ± std, as a markdown table.
"""

import json
import os

import numpy as np
from absl import flags

from moejax import cli, cli_files
from moejax.errors import ConfigError
from moejax.analysis.polyglot_floor import run_report
from moejax.evaluation.stats import markdown_table, t_interval

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir of a polyglot_synth run.")
_SWEEP_DIR = flags.DEFINE_string(
  "sweep_dir", None, "A training study's settings.workdir, of polyglot_synth runs (ARM/seed_N/)."
)
_JSON = flags.DEFINE_string("json", None, "Also write the figures here.")


def sweep_runs(sweep_dir: str) -> dict:
  """{arm: {seed: workdir}} of the finished runs (checkpoints/) under sweep_dir."""
  runs = {}
  for arm in sorted(os.listdir(sweep_dir)):
    arm_dir = os.path.join(sweep_dir, arm)
    if not os.path.isdir(arm_dir):
      continue
    for name in sorted(os.listdir(arm_dir)):
      if name.startswith("seed_") and os.path.isdir(os.path.join(arm_dir, name, "checkpoints")):
        runs.setdefault(arm, {})[int(name[len("seed_") :])] = os.path.join(arm_dir, name)
  if not runs:
    raise cli.flag_error(_SWEEP_DIR, "expected ARM/seed_N/checkpoints run directories")
  return runs


def sweep_table(reports: dict) -> str:
  """Markdown: per arm, mean ± std over seeds of excess, steps to 5% and mean NMI."""

  def stat(values):
    spread = t_interval(values)
    return f"{spread.mean:.4f} ± {spread.std or 0.0:.4f}"

  rows = []
  for arm, by_seed in reports.items():
    runs = [by_seed[s] for s in sorted(by_seed)]
    steps = [r["steps_to_5pct"] for r in runs]
    rows.append(
      [
        arm,
        ",".join(map(str, sorted(by_seed))),
        stat([r["excess"] for r in runs]),
        "never" if None in steps else f"{t_interval(steps).mean:.0f}",
        stat([np.mean(r["nmi_language_top1_expert"]) for r in runs]),
      ]
    )
  return markdown_table(
    [
      "arm",
      "seeds",
      "excess over the floor",
      "steps to within 5%",
      "NMI(language, top-1 expert), mean over layers",
    ],
    rows,
  )


def main(argv):
  del argv
  if (_WORKDIR.value is None) == (_SWEEP_DIR.value is None):
    raise ConfigError(
      f"give exactly one of --workdir and --sweep_dir (--workdir="
      f"{_WORKDIR.value}, --sweep_dir={_SWEEP_DIR.value})"
    )
  cli_files.output_file("json", _JSON.value)
  if _SWEEP_DIR.value is not None and not os.path.isdir(_SWEEP_DIR.value):
    raise cli.flag_error(_SWEEP_DIR, "expected an existing directory")
  if _WORKDIR.value is not None:
    cli_files.existing_workdir("workdir", _WORKDIR.value, kinds=("training", "mixed"))
    out = run_report(_WORKDIR.value)
    print(json.dumps(out, indent=1))
  else:
    runs = sweep_runs(_SWEEP_DIR.value)
    out = {
      arm: {seed: run_report(w) for seed, w in by_seed.items()} for arm, by_seed in runs.items()
    }
    print(sweep_table(out))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
