r"""CodeQuant's "up to 4.15x speedup on CPU" (lookup-table matmul) measured on this CPU.

  python -m experiments.benchmarks.lut_matmul [--shapes=qwen3_moe_bench,qwen3_30b_a3b]
      [--batches=1,8] [--group_size=32] [--reps=7] [--json=FILE] [--markdown=FILE]

One expert matrix per --shapes entry (a preset or d_in:d_out), 4-bit, at each batch:
float32 x @ W against 4-bit dequantize-then-matmul, the FFI affine kernel, the FFI
lookup-table kernel and the XLA bucket-sum form of the same codebooks (arms and
figures: moejax/profiling/lut_matmul.py). Medians of --reps interleaved rounds, each
about 20 ms of back-to-back calls.
"""

import datetime
import os
import platform

from absl import flags

from moejax import cli, cli_files
from moejax.profiling import lut_matmul

_SHAPES = flags.DEFINE_list("shapes", list(lut_matmul.SHAPES), "Presets or d_in:d_out.")
_BATCHES = cli.checked(flags.DEFINE_list("batches", ["1", "8"], "Rows per call."), cli.at_least(1))
_GROUP = cli.checked(
  flags.DEFINE_integer("group_size", 32, "Input rows per scale / codebook."), cli.at_least(1)
)
_REPS = cli.checked(flags.DEFINE_integer("reps", 7, "Interleaved rounds."), cli.at_least(1))
OUTPUTS = cli_files.study_outputs(plot=False)


def main(argv):
  del argv
  shapes = [cli.preset_or_ints(s, lut_matmul.SHAPES, "d_in:d_out", "shapes") for s in _SHAPES.value]
  for _, (d_in, d_out) in shapes:
    if d_in % _GROUP.value:
      raise cli.flag_error(_GROUP, f"must divide every d_in; {d_in} is not a multiple")
  OUTPUTS.check()
  rows = []
  for name, (d_in, d_out) in shapes:
    rows += lut_matmul.shape_rows(
      name, d_in, d_out, [int(b) for b in _BATCHES.value], _GROUP.value, _REPS.value
    )
  text = lut_matmul.table(rows)
  print(text)
  meta = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
    "machine": platform.machine(),
    "cpus": os.cpu_count(),
    "group_size": _GROUP.value,
    "reps": _REPS.value,
    "loadavg": os.getloadavg(),
  }
  OUTPUTS.write({"meta": meta, "rows": rows}, f"{meta}\n\n{text}\n")


if __name__ == "__main__":
  cli.run(main)
