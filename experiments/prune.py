r"""Prune the experts of a trained MoE: calibrate, choose per layer, cut, save.

  python -m experiments.prune --workdir=runs/zoo/s --method=schur_astar --keep=0.5 \
      --out=runs/pruned/s_schur_50
  python -m experiments.evaluate --workdir=runs/pruned/s_schur_50 --reference_workdir=runs/zoo/s

--workdir: a training workdir (its latest checkpoint is pruned) or a converted
one; or --hf_dir, an HF checkpoint. An imported model is calibrated on
--calibration (.npy token ids, or .jsonl {"text": ...} lines read with its
tokenizer.json) and written as a converted workdir. --method: one
of schur_astar (SCHUR-A*, optimal for --objective), greedy, step (Step: token-
selective scores, then the pruned experts merged into the kept), step_no_merge
(the same choice, no merge), frequency,
router_mass, output_norm, random (moejax/posttrain/expert_subset.py), or an
atom method: heapr, heapr_first_order, atom_magnitude, atom_random
(moejax/posttrain/atoms.py); every one is registered in
moejax/posttrain/methods.py (PRUNERS). --keep: experts kept per MoE layer, a fraction
(0.5), a count (8), or knee (each layer's own count, at the knee of the
method's err(m) curve); for an atom method, the fraction of all atoms kept. Calibration:
--num_windows windows of --context tokens drawn with --seed from the training
split. --out: the pruned training workdir (one checkpoint at the source's step;
experiments.train continues it, experiments.evaluate scores it). --report:
per layer the kept experts and err(S) / err(none), as JSON. See
moejax/posttrain/prune.py and prune_workdir.py. Every method at every keep level on
calibration draws: configs/studies/pruning.py.
"""

import json

from absl import flags

from moejax import cli, cli_files
from moejax.errors import ConfigError

_WORKDIR = flags.DEFINE_string("workdir", None, "A training or converted workdir.")
_HF_DIR = flags.DEFINE_string("hf_dir", None, "An HF checkpoint directory.")
_CALIBRATION = flags.DEFINE_string(
  "calibration",
  None,
  "For --hf_dir or a converted workdir: calibration tokens, .npy ids or .jsonl texts.",
)
_METHOD = flags.DEFINE_string("method", "schur_astar", "How to choose the kept experts.")
_KEEP = flags.DEFINE_string(
  "keep",
  None,
  "Experts kept per MoE layer: a fraction (0.5), a "
  "count (8) or knee; atom methods: the fraction of all atoms.",
)
_OBJECTIVE = flags.DEFINE_string(
  "objective", "rescaled", "SCHUR-A* / greedy objective: rescaled (least squares) or no_rescale."
)
_RESCALE = flags.DEFINE_bool(
  "rescale",
  False,
  "Fold the least-squares weights of the kept experts into their output projections.",
)
_NUM_WINDOWS = cli.checked(
  flags.DEFINE_integer("num_windows", 64, "Calibration windows."), cli.at_least(1)
)
_CONTEXT = cli.checked(
  flags.DEFINE_integer("context", 0, "Tokens per calibration window; 0 = the training seq_len."),
  cli.at_least(0),
)
_BATCH = cli.checked(
  flags.DEFINE_integer("batch_size", 8, "Windows per model call."), cli.at_least(1)
)
_SEED = cli.checked(
  flags.DEFINE_integer("seed", 0, "Calibration draw (and the random method's scores)."),
  cli.in_range(0, 2**32 - 1),
)
_OUT = flags.DEFINE_string("out", None, "Write the pruned training workdir here (new or empty).")
_REPORT = flags.DEFINE_string("report", None, "Write the report here as JSON.")
_STATISTICS = flags.DEFINE_string(
  "save_statistics",
  None,
  "Also write the calibration "
  "statistics (per MoE layer: Gram, frequency, mass) here as "
  ".npz (posttrain/contributions.save_statistics).",
)
flags.mark_flags_as_required(["keep"])


def table(report: dict) -> str:
  lines = [
    f"{report['method']} ({report['objective']}), keep {report['keep']}: "
    f"{report['expert_counts']} experts per MoE layer",
    "block | experts | kept | err(S) / err(none)",
  ]
  for layer in report["layers"]:
    if "kept_atoms" in layer:  # an atom method: atoms kept per expert
      lines.append(f"{layer['block']} | {layer['experts']} | atoms {layer['kept_atoms']} | —")
    else:
      lines.append(
        f"{layer['block']} | {layer['experts']} | {layer['kept']} | {layer['relative_error']:.4f}"
      )
  return "\n".join(lines)


def main(argv):
  del argv
  kind = cli_files.one_source(_WORKDIR, _HF_DIR)
  if kind != "training" and _CALIBRATION.value is None:
    source = f"--hf_dir={_HF_DIR.value}" if _HF_DIR.value else f"--workdir={_WORKDIR.value}"
    raise ConfigError(
      "an imported model has no training split: give --calibration "
      f"(.npy token ids or .jsonl texts) ({source})"
    )
  inputs = [
    ("--workdir", _WORKDIR.value),
    ("--hf_dir", _HF_DIR.value),
    ("--calibration", _CALIBRATION.value),
  ]
  cli_files.output_dir("out", _OUT.value, empty=True, not_inside=inputs)
  cli_files.output_file("report", _REPORT.value, not_inside=inputs[2:])
  cli_files.output_file(
    "save_statistics", _STATISTICS.value, suffixes=(".npz",), not_inside=inputs[2:]
  )
  from moejax.posttrain import methods  # the names only: no jax yet

  methods.pruner(_METHOD.value)
  from moejax.posttrain.prune_workdir import prune_imported, prune_workdir

  options = dict(
    keep=_KEEP.value,
    method=_METHOD.value,
    objective=_OBJECTIVE.value,
    num_windows=_NUM_WINDOWS.value,
    context=_CONTEXT.value,
    seed=_SEED.value,
    batch_size=_BATCH.value,
    rescale=_RESCALE.value,
    save_statistics=_STATISTICS.value,
  )
  if kind in ("training", "mixed") and _CALIBRATION.value is None:
    report = prune_workdir(_WORKDIR.value, _OUT.value, **options)
  else:
    report = prune_imported(
      hf_dir=_HF_DIR.value,
      workdir=None if _HF_DIR.value else _WORKDIR.value,
      out=_OUT.value,
      calibration=_CALIBRATION.value,
      **options,
    )
  print(table(report))
  if _REPORT.value:
    with open(_REPORT.value, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
