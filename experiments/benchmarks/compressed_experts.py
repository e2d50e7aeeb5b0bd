r"""CPU speed and memory of the compressed expert types against fp32 SwiGLU experts.

  python -m experiments.benchmarks.compressed_experts                 # zoo_s, large; T 1,256,2048
  python -m experiments.benchmarks.compressed_experts --sizes=zoo_s --tokens=1,256 --reps=3
  python -m experiments.benchmarks.compressed_experts --json=/tmp/r.json --markdown=/tmp/r.md

What is timed: the whole MoE layer forward as the model calls it
(moejax/layers/moe.py MoELayer(x [1, T, d], train=False), jitted), built from the
zoo-s config (moejax/configs/zoo.py: router topk, dispatch dropless, grouped_matmul
auto, no shared expert) as inference runs it (moejax/inference/generate.py
generation_config: dropless.tile 8), with model.moe.experts set to each expert
type, so router, dispatch and the aux metrics are the same for every row; only
the experts differ.
grouped_matmul 'auto' on CPU runs the type's fused path (SonicMoE block loop) for
swiglu, quantized and codebook, and the 'loop' grouped matmul for factorised (no
fused path). The compressed types' weights are built by their own `build` (RTN /
quantile codebooks of the SwiGLU init; random Tucker factors): the speed does not
depend on the values.

Sizes (--sizes): zoo_s = zoo-s's MoE layer (d, f, E, k read from zoo.SIZES['s']),
large = d 512, f 1024, E 8, k 2, or d:f:E:k. Tokens (--tokens): T = 1 is one decode
step, 256 and 2048 batches of tokens.

Variants (--variants):
  swiglu                   fp32 experts, the reference (always run)
  quantized_4bit / _2bit   model.moe.quantized bits 4 / 2, group --group_size, asymmetric
  codebook_4bit            model.moe.codebook bits 4, group --group_size, rotation none
  codebook_4bit_hadamard   the same with rotation hadamard
  factorised_50pct         model.moe.factorised with every projection's ranks
                           (E, r, r), r chosen so that its Tucker count is nearest
                           --factorised_fraction of the projection's E d_in d_out
--group_size is used as given if it divides d and f, else the largest divisor of
both below it.

Per row: median ms per call, ratio = swiglu time / path time (1.0 = as fast as
fp32, same run), and from the compiled layer (`jit(...).lower().compile()`,
deterministic): memory_analysis() argument and temp bytes (the arguments are the
layer's stored state, codes as uint8; temp above swiglu's temp by about the dense
expert weights' fp32 bytes means the dequantized weights are materialised),
cost_analysis() flops (XLA's static count: the block loops' bodies count once,
not per trip), and the bytes the experts hold: in memory (uint8 codes, one per
byte), bit-packed (`packed_bytes`, quantized and codebook) and of the fp32 SwiGLU
experts.

Timing: every variant of a (size, T) is compiled ahead and called twice untimed;
a repetition is `inner` back-to-back calls (each blocked on), inner chosen from
the untimed call so that a repetition lasts about --min_rep_ms; repetitions are
interleaved (round r runs every variant once, order rotated by r) and the
median per call taken: the machine is shared and noisy (moejax/profiling/timing.py).
"""

import datetime
import os
import time

from absl import flags
import jax

from moejax import cli, cli_files
from moejax.configs import zoo
from moejax.profiling.compressed_experts import (
  REFERENCE,
  VARIANTS,
  Settings,
  bench,
  build_layer,
  markdown,
)
from moejax.profiling.timing import cpu_model

# d, f, E, k; zoo_s from moejax/configs/zoo.py (d, ..., experts, top_k, expert_d_ff, ...)
_S = zoo.SIZES["s"]
PRESETS = {"zoo_s": (_S[0], _S[7], _S[5], _S[6]), "large": (512, 1024, 8, 2)}

_SIZES = flags.DEFINE_list("sizes", ["zoo_s", "large"], f"Presets {sorted(PRESETS)} or d:f:E:k.")
_TOKENS = cli.checked(
  flags.DEFINE_list("tokens", ["1", "256", "2048"], "Tokens T per call."), cli.at_least(1)
)
_VARIANTS = cli.checked(
  flags.DEFINE_list("variants", list(VARIANTS), "Variants to run (swiglu is always run)."),
  cli.one_of(*VARIANTS),
)
_GROUP = cli.checked(
  flags.DEFINE_integer("group_size", 32, "Quantized and codebook group size (input rows)."),
  cli.at_least(1),
)
_FRACTION = cli.checked(
  flags.DEFINE_float(
    "factorised_fraction", 0.5, "factorised_50pct: Tucker parameters / fp32 ones."
  ),
  cli.in_range(0.0, 1.0, low_open=True),
)
_MIN_REP_MS = cli.checked(
  flags.DEFINE_float("min_rep_ms", 20.0, "A repetition repeats the call to last about this."),
  cli.at_least(0.0, float),
)
_MAX_INNER = cli.checked(
  flags.DEFINE_integer("max_inner", 200, "Most calls per repetition."), cli.at_least(1)
)
_REPS = cli.checked(
  flags.DEFINE_integer("reps", 5, "Interleaved repetitions (median)."), cli.at_least(1)
)
OUTPUTS = cli_files.study_outputs(plot=False)


def settings() -> Settings:
  return Settings(
    zoo.get_config("model=s"),
    _GROUP.value,
    _FRACTION.value,
    _REPS.value,
    _MIN_REP_MS.value,
    _MAX_INNER.value,
  )


def flag_text(name: str) -> str:
  value = flags.FLAGS[name].value
  return ",".join(value) if isinstance(value, list) else str(value)


def main(argv):
  del argv
  OUTPUTS.check()
  sizes = [cli.preset_or_ints(s, PRESETS, "d:f:E:k", "sizes") for s in _SIZES.value]
  tokens = [int(t) for t in _TOKENS.value]
  variants = [REFERENCE] + [v for v in _VARIANTS.value if v != REFERENCE]
  chosen = settings()
  for _, dims in sizes:  # every config refused before anything compiles
    for name in variants:
      build_layer(name, dims, chosen)
  started = time.perf_counter()
  records = []
  for label, dims in sizes:
    records += bench(label, dims, tokens, variants, chosen)
  command = " ".join(
    ["python -m experiments.benchmarks.compressed_experts"]
    + [
      f"--{name}={flag_text(name)}"
      for name in (
        "sizes",
        "tokens",
        "variants",
        "group_size",
        "factorised_fraction",
        "reps",
        "min_rep_ms",
      )
    ]
  )
  text = markdown(records, command, chosen)
  print(text, flush=True)
  OUTPUTS.write(
    {
      "machine": cpu_model(),
      "cores": os.cpu_count(),
      "jax": jax.__version__,
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "loadavg": os.getloadavg(),
      "command": command,
      "wall_s": time.perf_counter() - started,
      "records": records,
    },
    text,
  )


if __name__ == "__main__":
  cli.run(main)
