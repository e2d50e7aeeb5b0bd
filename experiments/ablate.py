r"""Run a config-driven ablation: every variant of a sweep, same budget and seed.

  python -m experiments.ablate --config=configs/ablations/routers.py --workdir=runs/routers
  python -m experiments.ablate --config=configs/ablations/routers.py --workdir=/tmp/r \
      --config.steps=60          # a quick look: every variant gets 60 steps

Writes WORKDIR/results.md (the table), WORKDIR/results.json and
WORKDIR/curves.png (training and validation curves of every variant). Re-running
with the same WORKDIR skips finished variants and resumes an interrupted one
from its checkpoint. Sweep format: moejax/train/sweep.py.
"""
import json
import os

from absl import app, flags, logging
from ml_collections import config_flags

from moejax.train.sweep import run_sweep
from moejax.train.sweep_report import markdown_table, plot_curves

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "One subdirectory per variant goes here.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  sweep, workdir = _CONFIG.value, _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)
  results = run_sweep(sweep, workdir, log=lambda msg: print(msg, flush=True))
  table = markdown_table(results)
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(f"# {sweep.title}\n\n{sweep.steps} steps, seed {sweep.seed}, "
            f"common overrides {list(sweep.common)}.\n\n{table}")
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump([{k: v for k, v in r.items() if k != "config"} for r in results], f, indent=1)
  plot_curves(workdir, [r["name"] for r in results], os.path.join(workdir, "curves.png"))
  print(table)


if __name__ == "__main__":
  app.run(main)
