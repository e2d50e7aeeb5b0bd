r"""Run a config-driven ablation: every variant of a sweep, same budget and seed.

  python -m experiments.ablate --config=configs/ablations/routers.py --workdir=runs/routers
  python -m experiments.ablate --config=configs/ablations/routers.py --workdir=/tmp/r \
      --config.steps=60          # a quick look: every variant gets 60 steps

Writes WORKDIR/<sweep>.md (the table), WORKDIR/<sweep>.json and
WORKDIR/<sweep>_curves.png (training and validation curves of every variant
and seed),
<sweep> being the config file's stem (routers, expert_types, ...). Re-running
with the same WORKDIR skips finished variants and resumes an interrupted one
from its checkpoint; sweeps that share a variant (same name and config) can
share a WORKDIR and train it once. Sweep format: moejax/train/sweep.py.
A sweep with `seeds=(...)` runs every variant on every seed and its table gives
the paired difference to the first variant, a 95% t-interval and a verdict
("reproduces" only when the interval excludes 0 in the variant's `expect`
direction): moejax/train/seed_stats.py. With `heldout_bytes_per_domain` the
table compares heldout_bpb, followed by one such table per held-out domain.
"""
import json
import os

from absl import flags
from ml_collections import config_flags

from moejax import cli

from moejax.train.sweep import metric_of, run_sweep, sweep_seeds
from moejax.train.sweep_report import markdown_table, plot_curves, seed_table

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "One subdirectory per variant goes here.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  sweep, workdir = _CONFIG.value, _WORKDIR.value
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise cli.flag_error(_WORKDIR, "expected a directory, found a file")
  if cli.workdir_kind(workdir) in ("training", "converted", "mixed"):
    raise cli.flag_error(_WORKDIR, "expected a sweep directory (one subdirectory per "
                         f"variant), found a workdir holding {cli.workdir_kind(workdir)} files")
  stem = os.path.splitext(os.path.basename(
      config_flags.get_config_filename(flags.FLAGS["config"])))[0]
  report = lambda suffix: os.path.join(workdir, stem + suffix)
  results = run_sweep(sweep, workdir, log=lambda msg: print(msg, flush=True))  # checks first
  os.makedirs(workdir, exist_ok=True)
  seeds = sweep_seeds(sweep)
  if "seeds" in sweep:  # then the same comparison on each held-out domain's bytes
    table = seed_table(results, metric_of(sweep)) + "".join(
        f"\n### {key}\n\n{seed_table(results, key)}"
        for key in sorted({k for r in results for k in r if k.startswith("heldout_bpb/")}))
  else:
    table = markdown_table(results)
  with open(report(".md"), "w") as f:
    f.write(f"# {sweep.title}\n\n{sweep.steps} steps, seed{'s' * (len(seeds) > 1)} "
            f"{', '.join(map(str, seeds))}, common overrides {list(sweep.common)}."
            f"\n\n{table}")
  with open(report(".json"), "w") as f:
    json.dump([{k: v for k, v in r.items() if k != "config"} for r in results], f, indent=1)
  plot_curves(results, report("_curves.png"))
  print(table)


if __name__ == "__main__":
  cli.run(main)
