r"""Compress the experts of a trained MoE: calibrate, allocate bits or ranks,
compress every MoE layer, save a training workdir of the compressed expert type.

  python -m experiments.compress --workdir=runs/zoo/s --method=gemq --level=2.5 \
      --finetune_steps=32 --out=runs/compressed/s_gemq_25
  python -m experiments.evaluate --workdir=runs/compressed/s_gemq_25
  python -m experiments.convert --workdir=runs/compressed/s_gemq_25 --out_hf_dir=DIR

--method (moejax/posttrain/compress_pipeline.py; the quantizers and decompositions
are registered in moejax/posttrain/methods.py): uniform, per_layer, gemq
(experts='quantized'; --quantizer rtn or gptq, --bit_choices, --rounds of
GEMQ's allocate-quantize-re-estimate loop), kmeans, codequant (experts=
'codebook'), td_moe, tucker (experts='factorised'); svd and whitened_svd are
baselines without an expert type (configs/studies/td_moe.py scores them).
--level: average bits per expert weight, or for a factorisation the fraction
of expert parameters removed. --finetune_steps: GEMQ's router fine-tuning,
run by the trainer in --out (train.trainable='router', AdamW at
--finetune_lr); experiments.train continues the workdir. Calibration:
--num_windows windows of the training seq_len drawn with --seed from the
training split. --report: the allocation (bits per expert, ranks per layer)
and byte counts, as JSON.
"""

import json

from absl import flags

from moejax import cli, cli_files

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir (float 'swiglu' experts).")
_METHOD = flags.DEFINE_string("method", "gemq", "Compression method.")
_LEVEL = cli.checked(
  flags.DEFINE_float(
    "level", None, "Average bits per expert weight, or the fraction of expert parameters removed."
  ),
  cli.at_least(0.0, float),
)
_QUANTIZER = flags.DEFINE_string("quantizer", "gptq", "rtn or gptq (quantized methods).")
_GROUP = cli.checked(
  flags.DEFINE_integer(
    "group_size", 32, "Input rows per quantization group / codebook; 0 = the whole input dim."
  ),
  cli.at_least(0),
)
_CHOICES = cli.checked(
  flags.DEFINE_list("bit_choices", ["2", "3", "4", "8"], "Bit-widths an expert may get."),
  cli.at_least(1),
)
_ROUNDS = cli.checked(
  flags.DEFINE_integer(
    "rounds", 1, "GEMQ rounds (costs re-estimated on the quantized, fine-tuned model)."
  ),
  cli.at_least(1),
)
_FT_STEPS = cli.checked(
  flags.DEFINE_integer("finetune_steps", 0, "Router fine-tuning steps after quantizing (GEMQ)."),
  cli.at_least(0),
)
_FT_LR = cli.checked(
  flags.DEFINE_float("finetune_lr", 1e-4, "Router fine-tuning learning rate."),
  cli.in_range(0, float("inf"), low_open=True),
)
_DAMPING = cli.checked(
  flags.DEFINE_float(
    "damping", 1e-6, "Whitening damping of td_moe and whitened_svd, relative to the mean variance."
  ),
  cli.in_range(0, float("inf"), low_open=True),
)
_NUM_WINDOWS = cli.checked(
  flags.DEFINE_integer("num_windows", 64, "Calibration windows."), cli.at_least(1)
)
_SEED = cli.checked(
  flags.DEFINE_integer("seed", 0, "Calibration draw."), cli.in_range(0, 2**32 - 1)
)
_OUT = flags.DEFINE_string(
  "out", None, "Write the compressed training workdir here (new or empty)."
)
_REPORT = flags.DEFINE_string("report", None, "Write the report here as JSON.")
flags.mark_flags_as_required(["workdir", "level"])


def main(argv):
  del argv
  cli_files.existing_workdir("workdir", _WORKDIR.value, kinds=("training",))
  cli_files.output_dir("out", _OUT.value, empty=True, not_inside=[("--workdir", _WORKDIR.value)])
  cli_files.output_file("report", _REPORT.value)
  choices = tuple(int(b) for b in _CHOICES.value)
  from moejax.posttrain import methods  # the names only: no jax yet

  methods.family(_METHOD.value)
  methods.integer_quantizer(_QUANTIZER.value)
  from moejax.posttrain import compress_pipeline as cp
  from moejax.posttrain import compress_workdir

  r = cp.Request(
    _METHOD.value,
    _LEVEL.value,
    quantizer=_QUANTIZER.value,
    group_size=_GROUP.value,
    bit_choices=choices,
    seed=_SEED.value,
    damping=_DAMPING.value,
  )
  report = compress_workdir.compress_workdir(
    _WORKDIR.value,
    _OUT.value,
    r,
    num_windows=_NUM_WINDOWS.value,
    rounds=_ROUNDS.value,
    finetune_steps=_FT_STEPS.value,
    finetune_lr=_FT_LR.value,
  )
  summary = {
    k: report[k]
    for k in ("method", "level", "average_bits", "parameters", "packed_bytes", "step")
    if k in report
  }
  print(json.dumps(summary))
  if _REPORT.value:
    with open(_REPORT.value, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
