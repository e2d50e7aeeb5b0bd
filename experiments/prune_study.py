r"""Every pruning method at every keep level on several calibration draws, scored on
the same held-out bytes (moejax/posttrain/study.py).

  python -m experiments.prune_study --workdir=runs/zoo/s --keeps=0.5,0.75 --draws=5 \
      --out=docs/results/posttrain/pruning_zoo_s.json \
      --table=docs/results/posttrain/pruning_zoo_s.md
"""
import json

from absl import flags

from moejax import cli
from moejax.evaluation.probe_data import PROBES
from moejax.posttrain.methods import METHODS

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir (checkpoints/).")
_METHODS = flags.DEFINE_list("methods", list(METHODS), "Methods to compare.")
_KEEPS = flags.DEFINE_list("keeps", ["0.5", "0.75"], "Keep levels (fractions or counts).")
_DRAWS = cli.checked(flags.DEFINE_integer("draws", 5, "Calibration draws (seeds 0..N-1)."),
                     cli.at_least(1))
_NUM_WINDOWS = cli.checked(flags.DEFINE_integer("num_windows", 64, "Calibration windows "
                                                "per draw."), cli.at_least(1))
_BYTES = cli.checked(flags.DEFINE_integer("bytes_per_domain", 32768, "Held-out bytes per "
                                          "domain (0 = all)."), cli.at_least(0))
_PROBES = flags.DEFINE_list("probes", None, "Probes (default: all for a mix model, else none): "
                            + ", ".join(PROBES))
_PROBE_COUNT = cli.checked(flags.DEFINE_integer("probe_count", 32, "Examples per probe group."),
                           cli.at_least(1))
_OUT = flags.DEFINE_string("out", None, "Write every run's scores here as JSON (rewritten "
                           "after each run).")
_TABLE = flags.DEFINE_string("table", None, "Write the markdown tables here.")
flags.mark_flag_as_required("workdir")


def main(argv):
  del argv
  cli.existing_workdir("workdir", _WORKDIR.value, kinds=("training", "mixed"))
  cli.output_file("out", _OUT.value)
  cli.output_file("table", _TABLE.value)
  if not _METHODS.value or not _KEEPS.value:
    raise cli.flag_error(_METHODS if not _METHODS.value else _KEEPS, "expected at least one")
  from moejax.errors import choice_error
  from moejax.posttrain import prune, study
  for method in _METHODS.value:
    if method not in METHODS:
      raise choice_error("--methods", method, METHODS)
  config, _ = prune.source_config(_WORKDIR.value)
  probes = _PROBES.value
  if probes is None:
    probes = list(PROBES) if config.data.name == "mix" else []
  def save(result):
    if _OUT.value:
      with open(_OUT.value, "w") as f:
        json.dump(result, f, indent=1)

  result = study.run_study(_WORKDIR.value, methods=_METHODS.value, keeps=_KEEPS.value,
                           draws=_DRAWS.value, num_windows=_NUM_WINDOWS.value,
                           bytes_per_domain=_BYTES.value, probes=probes,
                           probe_count=_PROBE_COUNT.value, on_run=save)
  domains = list(result["unpruned"]["bpb"])
  text = "\n\n".join([f"### The papers' claims (bpb on all)\n\n" + study.claims_table(result)]
                     + [f"### bpb on {d}\n\n" + study.summary_table(result, d)
                        for d in domains])
  print(text)
  save(result)
  if _TABLE.value:
    with open(_TABLE.value, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  cli.run(main)
