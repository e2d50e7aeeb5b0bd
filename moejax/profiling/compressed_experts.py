"""The compressed expert types' benchmark (experiments/benchmarks/compressed_experts.py):
each variant's MoE layer built from the zoo-s config, its compiled forward timed
interleaved against the fp32 SwiGLU experts, its compiled and held bytes, and the
report's tables. What each figure means: the benchmark's docstring.
"""

import copy
import dataclasses
import datetime
import os

from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from moejax.evaluation.stats import markdown_table
from moejax.experts.factorised import tucker_count
from moejax.inference.generate import generation_config
from moejax.layers.moe import MoELayer
from moejax.models.structure import layer_moe_config
from moejax.profiling.timing import (
  calls_per_round,
  compile_pass,
  compiled_figures,
  cpu_model,
  interleaved_times,
  medians,
)
from moejax.validation import validate_config

VARIANTS = (
  "swiglu",
  "quantized_4bit",
  "quantized_2bit",
  "codebook_4bit",
  "codebook_4bit_hadamard",
  "factorised_50pct",
)
REFERENCE = "swiglu"


@dataclasses.dataclass(frozen=True)
class Settings:
  """The benchmark's settings: the config whose MoE layer every variant rebuilds (the
  zoo-s one), the largest quantized and codebook group size, the factorised variant's
  Tucker parameters / fp32 ones, interleaved repetitions, and a repetition's length
  (about min_rep_ms, at most max_inner calls)."""

  config: Any
  group_size: int
  factorised_fraction: float
  reps: int
  min_rep_ms: float
  max_inner: int


def group_size(d: int, f: int, most: int) -> int:
  """`most` if it divides d and f, else the largest common divisor below it."""
  return max(g for g in range(1, most + 1) if d % g == 0 and f % g == 0)


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


def variant_settings(name: str, dims, settings: Settings) -> tuple[str, dict]:
  """(model.moe.experts, its section model.moe.<type>) of a variant."""
  d, f, _, _ = dims
  g = group_size(d, f, settings.group_size)
  variants: dict[str, tuple[str, dict]] = {
    "swiglu": ("swiglu", {}),
    "quantized_4bit": ("quantized", {"bits": 4, "group_size": g, "symmetric": False}),
    "quantized_2bit": ("quantized", {"bits": 2, "group_size": g, "symmetric": False}),
    "codebook_4bit": ("codebook", {"bits": 4, "group_size": g, "rotation": "none"}),
    "codebook_4bit_hadamard": ("codebook", {"bits": 4, "group_size": g, "rotation": "hadamard"}),
    "factorised_50pct": ("factorised", factorised_ranks(dims, settings.factorised_fraction)),
  }
  return variants[name]


def build_layer(name: str, dims, settings: Settings) -> tuple[MoELayer, dict]:
  """settings.config's MoE layer at `dims` with the variant's experts, through the
  model config."""
  d, f, e, k = dims
  c = copy.deepcopy(settings.config)
  m = c.model
  m.d_model, m.d_ff = d, k * f
  m.moe.num_experts, m.moe.top_k, m.moe.expert_d_ff, m.moe.shared.d_ff = e, k, f, f
  expert_type, section = variant_settings(name, dims, settings)
  m.moe.experts = expert_type
  if section:
    m.moe[expert_type].update(section)
  validate_config(c)
  m = generation_config(m)  # as inference runs the layer: dropless, tile min(tile, 8)
  layer = MoELayer(m.d_model, layer_moe_config(m, 0), rngs=nnx.Rngs(0), dtype=jnp.float32)
  return layer, {
    "experts": expert_type,
    **{k_: list(v) if isinstance(v, tuple) else v for k_, v in section.items()},
  }


def expert_bytes(layer: MoELayer) -> tuple[int, int]:
  """(bytes the expert variables hold in memory, bytes of their packed form)."""
  held = sum(int(np.asarray(v).nbytes) for v in jax.tree.leaves(nnx.state(layer.experts)))
  packed = layer.experts.packed_bytes() if hasattr(layer.experts, "packed_bytes") else held
  return held, int(packed)


def prepare(name, dims, x, settings: Settings):
  """Compiled layer forward, its args, and the row's deterministic figures."""
  layer, described = build_layer(name, dims, settings)
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
      "settings": described,
      **compiled_figures(compiled),
      "expert_bytes_in_memory": held,
      "expert_bytes_packed": packed,
      "expert_bytes_fp32": 4 * 3 * e * d * f,
    },
  )


def bench(label, dims, tokens, variants, settings: Settings) -> list:
  """One record per T in `tokens` and variant (REFERENCE first) at `dims`."""
  d, f, e, k = dims
  records = []
  for t in tokens:
    x = jnp.asarray(np.random.default_rng(1).standard_normal((1, t, d)), jnp.float32)
    calls, figures = {}, {}
    for name in variants:
      compiled, args, figures[name] = prepare(name, dims, x, settings)
      calls[name] = lambda compiled=compiled, args=args: compiled(*args)
    inner = {
      name: calls_per_round(fn, settings.min_rep_ms / 1e3, settings.max_inner)
      for name, fn in calls.items()
    }
    per_call = medians(interleaved_times(calls, settings.reps, inner))
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
          "reps": settings.reps,
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
  """A record's expert settings in words."""
  if settings["experts"] == "factorised":
    return "ranks " + " / ".join(
      f"({', '.join(map(str, settings[key]))})" for key in ("ranks_gate", "ranks_up", "ranks_down")
    )
  if settings["experts"] == "swiglu":
    return "fp32"
  extra = f", {settings['rotation']}" if "rotation" in settings else ""
  return f"{settings['bits']}-bit, group {settings['group_size']}{extra}"


def markdown(records, command: str, settings: Settings) -> str:
  """The machine, `command`, what the columns mean, then a table per size."""

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
    f"medians of {settings.reps} interleaved repetitions, each the "
    f"mean of `calls` calls (about {settings.min_rep_ms:g} ms). ratio = swiglu time / "
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
