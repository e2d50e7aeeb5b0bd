r"""CPU speed and memory of the compressed expert types against fp32 SwiGLU experts.

  python -m experiments.benchmarks.compressed_experts                 # zoo_s, large; T 1,256,2048
  python -m experiments.benchmarks.compressed_experts --sizes=zoo_s --tokens=1,256 --reps=3
  python -m experiments.benchmarks.compressed_experts --json=/tmp/r.json --markdown=/tmp/r.md

What is timed: the whole MoE layer forward as the model calls it
(moejax/layers/moe.py MoELayer(x [1, T, d], train=False), jitted), built from the
zoo-s config (moejax/configs/zoo.py: router topk, dispatch dropless, grouped_matmul
auto, no shared expert) as inference runs it (moejax/inference/generate.py
generation_config: dropless_tile 8), with model.moe.experts set to each expert
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
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from moejax import cli, cli_files
from moejax.models.structure import layer_moe_config
from moejax.validation import validate_config
from moejax.configs import zoo
from moejax.errors import ConfigError
from moejax.evaluation.stats import markdown_table
from moejax.experts.factorised import tucker_count
from moejax.inference.generate import generation_config
from moejax.layers.moe import MoELayer
from moejax.profiling.timing import (
  calls_per_round,
  compile_pass,
  compiled_figures,
  cpu_model,
  interleaved_times,
  medians,
)

# d, f, E, k; zoo_s from moejax/configs/zoo.py (d, ..., experts, top_k, expert_d_ff, ...)
_S = zoo.SIZES["s"]
PRESETS = {"zoo_s": (_S[0], _S[7], _S[5], _S[6]), "large": (512, 1024, 8, 2)}
VARIANTS = (
  "swiglu",
  "quantized_4bit",
  "quantized_2bit",
  "codebook_4bit",
  "codebook_4bit_hadamard",
  "factorised_50pct",
)
REFERENCE = "swiglu"

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


def parse_size(spec: str):
  if spec in PRESETS:
    return spec, PRESETS[spec]
  try:
    dims = tuple(int(v) for v in spec.split(":"))
  except ValueError:
    dims = ()
  if len(dims) != 4 or min(dims) < 1:
    raise ConfigError(f"a preset {sorted(PRESETS)} or d:f:E:k of positive ints (--sizes={spec})")
  return spec, dims


def group_size(d: int, f: int) -> int:
  """--group_size if it divides d and f, else the largest common divisor below it."""
  return max(g for g in range(1, _GROUP.value + 1) if d % g == 0 and f % g == 0)


def factorised_ranks(dims, fraction: float) -> dict:
  """{ranks_gate, ranks_up, ranks_down}: (E, r, r), the r whose Tucker count is
  nearest `fraction` of the projection's E d_in d_out fp32 parameters."""
  d, f, e, _ = dims
  out = {}
  for key, (d_in, d_out) in (("ranks_gate", (d, f)), ("ranks_up", (d, f)), ("ranks_down", (f, d))):
    target = fraction * e * d_in * d_out
    r = min(
      range(1, min(d_in, d_out) + 1),
      key=lambda r: abs(tucker_count((e, d_in, d_out), (e, r, r)) - target),
    )
    out[key] = (e, r, r)
  return out


def variant_settings(name: str, dims) -> tuple[str, dict]:
  """(model.moe.experts, its section model.moe.<type>) of a variant."""
  d, f, _, _ = dims
  g = group_size(d, f)
  return {
    "swiglu": ("swiglu", {}),
    "quantized_4bit": ("quantized", {"bits": 4, "group_size": g, "symmetric": False}),
    "quantized_2bit": ("quantized", {"bits": 2, "group_size": g, "symmetric": False}),
    "codebook_4bit": ("codebook", {"bits": 4, "group_size": g, "rotation": "none"}),
    "codebook_4bit_hadamard": ("codebook", {"bits": 4, "group_size": g, "rotation": "hadamard"}),
    "factorised_50pct": ("factorised", factorised_ranks(dims, _FRACTION.value)),
  }[name]


def build_layer(name: str, dims) -> tuple[MoELayer, dict]:
  """The zoo-s MoE layer at `dims` with the variant's experts, through the model config."""
  d, f, e, k = dims
  c = zoo.get_config("model=s")
  m = c.model
  m.d_model, m.d_ff = d, k * f
  m.moe.num_experts, m.moe.top_k, m.moe.expert_d_ff, m.moe.shared_d_ff = e, k, f, f
  expert_type, settings = variant_settings(name, dims)
  m.moe.experts = expert_type
  if settings:
    m.moe[expert_type].update(settings)
  validate_config(c)
  m = generation_config(m)  # as inference runs the layer: dropless, tile min(tile, 8)
  layer = MoELayer(m.d_model, layer_moe_config(m, 0), rngs=nnx.Rngs(0), dtype=jnp.float32)
  return layer, {
    "experts": expert_type,
    **{k_: list(v) if isinstance(v, tuple) else v for k_, v in settings.items()},
  }


def expert_bytes(layer: MoELayer) -> tuple[int, int]:
  """(bytes the expert variables hold in memory, bytes of their packed form)."""
  held = sum(int(np.asarray(v).nbytes) for v in jax.tree.leaves(nnx.state(layer.experts)))
  packed = layer.experts.packed_bytes() if hasattr(layer.experts, "packed_bytes") else held
  return held, int(packed)


def prepare(name, dims, x):
  """Compiled layer forward, its args, and the row's deterministic figures."""
  layer, settings = build_layer(name, dims)
  graphdef, state = nnx.split(layer)

  def forward(state, x):
    y, aux = nnx.merge(graphdef, state)(x, train=False)
    return y, aux

  compiled, args, _ = compile_pass(forward, state, x, "fwd")
  held, packed = expert_bytes(layer)
  d, f, e, _ = dims
  return (
    compiled,
    args,
    {
      "settings": settings,
      **compiled_figures(compiled),
      "expert_bytes_in_memory": held,
      "expert_bytes_packed": packed,
      "expert_bytes_fp32": 4 * 3 * e * d * f,
    },
  )


def bench(label, dims, tokens, variants):
  d, f, e, k = dims
  records = []
  for t in tokens:
    x = jnp.asarray(np.random.default_rng(1).standard_normal((1, t, d)), jnp.float32)
    calls, figures = {}, {}
    for name in variants:
      compiled, args, figures[name] = prepare(name, dims, x)
      calls[name] = lambda compiled=compiled, args=args: compiled(*args)
    inner = {
      name: calls_per_round(fn, _MIN_REP_MS.value / 1e3, _MAX_INNER.value)
      for name, fn in calls.items()
    }
    per_call = medians(interleaved_times(calls, _REPS.value, inner))
    for name in variants:
      median = per_call[name]
      records.append(
        {
          "size": label,
          "d": d,
          "f": f,
          "E": e,
          "k": k,
          "T": t,
          "variant": name,
          "time_ms": 1e3 * median,
          "ratio_to_swiglu": per_call[REFERENCE] / median,
          "reps": _REPS.value,
          "calls_per_rep": inner[name],
          **figures[name],
          "temp_over_swiglu_bytes": (
            figures[name]["temp_bytes"] - figures[REFERENCE]["temp_bytes"]
          ),
          "flops_over_swiglu": figures[name]["flops"] - figures[REFERENCE]["flops"],
        }
      )
    print(
      f"{label} T={t}: " + ", ".join(f"{n} {1e3 * per_call[n]:.2f} ms" for n in variants),
      flush=True,
    )
  return records


def describe(settings: dict) -> str:
  if settings["experts"] == "factorised":
    return "ranks " + " / ".join(
      f"({', '.join(map(str, settings[key]))})" for key in ("ranks_gate", "ranks_up", "ranks_down")
    )
  if settings["experts"] == "swiglu":
    return "fp32"
  extra = f", {settings['rotation']}" if "rotation" in settings else ""
  return f"{settings['bits']}-bit, group {settings['group_size']}{extra}"


def markdown(records, command: str) -> str:
  def mib(b):
    return f"{b / 2**20:.2f}"

  load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
  lines = [
    f"Machine: {cpu_model()}, {os.cpu_count()} cores (shared with other jobs), jax "
    f"{jax.__version__}, backend {jax.default_backend()}; "
    f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}; load average at the end "
    f"{load}.",
    "",
    f"    {command}",
    "",
    "MoE layer forward (router topk + dropless dispatch + experts, train=False) as "
    "inference builds it (generation_config: dropless, tile 8), fp32, x [1, T, d]; "
    f"medians of {_REPS.value} interleaved repetitions, each the "
    f"mean of `calls` calls (about {_MIN_REP_MS.value:g} ms). ratio = swiglu time / "
    "path time (1.0 = as fast as fp32). arg and temp: compiled memory_analysis(); "
    "temp - swiglu: this row's temp minus swiglu's at the same T; GFLOP: "
    "cost_analysis() (static: the block loops' bodies count once, so GFLOP - swiglu is "
    "the per-call work outside them: dequantize, decode, rotate). expert MiB: held in "
    "memory (uint8 codes) / bit-packed (the swiglu row: fp32 experts).",
    "",
  ]
  for size in dict.fromkeys(r["size"] for r in records):
    rows = [r for r in records if r["size"] == size]
    r0 = rows[0]
    lines += [
      f"### {size}: d={r0['d']}, f={r0['f']}, E={r0['E']}, k={r0['k']}; fp32 expert "
      f"weights {mib(r0['expert_bytes_fp32'])} MiB",
      "",
      markdown_table(
        [
          "T",
          "variant",
          "settings",
          "ms",
          "ratio",
          "calls",
          "arg MiB",
          "temp MiB",
          "temp - swiglu MiB",
          "arg + temp MiB",
          "GFLOP",
          "GFLOP - swiglu",
          "expert MiB held / packed",
          "packed / fp32",
        ],
        [
          [
            r["T"],
            r["variant"],
            describe(r["settings"]),
            f"{r['time_ms']:.3f}",
            f"{r['ratio_to_swiglu']:.2f}",
            r["calls_per_rep"],
            mib(r["argument_bytes"]),
            mib(r["temp_bytes"]),
            mib(r["temp_over_swiglu_bytes"]),
            mib(r["argument_bytes"] + r["temp_bytes"]),
            f"{r['flops'] / 1e9:.3f}",
            f"{r['flops_over_swiglu'] / 1e9:.3f}",
            f"{mib(r['expert_bytes_in_memory'])} / {mib(r['expert_bytes_packed'])}",
            f"{r['expert_bytes_packed'] / r['expert_bytes_fp32']:.3f}",
          ]
          for r in rows
        ],
      ),
    ]
    lines.append("")
  return "\n".join(lines)


def flag_text(name: str) -> str:
  value = flags.FLAGS[name].value
  return ",".join(value) if isinstance(value, list) else str(value)


def main(argv):
  del argv
  OUTPUTS.check()
  sizes = [parse_size(s) for s in _SIZES.value]
  tokens = [int(t) for t in _TOKENS.value]
  variants = [REFERENCE] + [v for v in _VARIANTS.value if v != REFERENCE]
  for _, dims in sizes:  # every config refused before anything compiles
    for name in variants:
      build_layer(name, dims)
  started = time.perf_counter()
  records = []
  for label, dims in sizes:
    records += bench(label, dims, tokens, variants)
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
  text = markdown(records, command)
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
