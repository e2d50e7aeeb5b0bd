r"""Run a study declared as a config (configs/studies/<name>.py), resuming where it stopped.

  python -m experiments.study --config=configs/studies/kmeans.py [--config.draws=3] [--out=DIR]

Outputs go to --out (default docs/results/studies/<name>): results.json (settings,
runs, claims), results.md (tables), results.png, provenance.json (every invocation).
Re-running the same command resumes: finished (arm, level, draw) runs are skipped.
"""

import os

from absl import flags
from ml_collections import config_flags

from moejax import cli, cli_files
from moejax.studies import runner

_CONFIG = config_flags.DEFINE_config_file("config", None, "A study config file.", lock_config=True)
_OUT = flags.DEFINE_string("out", None, "Output directory (default docs/results/studies/NAME).")
_PLOT = flags.DEFINE_bool("plot", True, "Write results.png.")
flags.mark_flag_as_required("config")


def main(argv):
  del argv
  spec, scorer = runner.prepare(_CONFIG.value)
  out = _OUT.value or os.path.join("docs", "results", "studies", spec.name)
  cli_files.output_dir("out", out, parents=_OUT.value is None)
  stored = runner.check_output(spec, out, make_parents=_OUT.value is None)
  if stored:
    print(f"resuming {spec.name}: {len(stored['runs'])} of {stored['total_runs']} runs done")
  results = runner.run(spec, scorer, out, stored=stored, plot=_PLOT.value)
  for row in results["claims"]:
    print(f"{row['text']} [{runner.report.level_label(row['level'])}]: {row['verdict']}")
  print(
    f"wrote {out}/{runner.RESULTS}, {runner.MARKDOWN}" + (f", {runner.PLOT}" if _PLOT.value else "")
  )


if __name__ == "__main__":
  cli.run(main)
