"""Generation with compressed experts against float32 experts, the measurements of
`python -m experiments.benchmarks.generate --experts=...` (its docstring lists the
figures): each variant of compressed_experts.VARIANTS made from the same float
model (RTN codes, k-means codebooks of its expert weights; every other parameter
shared), generating greedily, interleaved with the float32 model in one process.
"""

from __future__ import annotations

import json
import time

import ml_collections
import numpy as np
from flax import nnx

from moejax.evaluation.stats import markdown_table
from moejax.profiling.compressed_experts import REFERENCE, Settings, variant_settings
from moejax.profiling.generation_profile import weight_bytes_per_step
from moejax.profiling.timing import interleaved_times, medians

KMEANS_ITERATIONS = 10  # codebook variants: Lloyd iterations (quantile start)


def converter(expert_type: str, section: dict):
  """The offline conversion (posttrain/compress.py) of one layer's float experts."""
  from moejax.posttrain import compress

  if expert_type == "quantized":
    return lambda w: compress.quantized_from_float(
      w, section["bits"], section["group_size"], symmetric=section["symmetric"]
    )
  return lambda w: compress.codebook_from_float(
    w,
    section["bits"],
    section["group_size"],
    rotation=section["rotation"],
    iterations=KMEANS_ITERATIONS,
    init="quantile",
  )


def split_arm(name: str) -> tuple[str, str]:
  """'<variant>[@<decode_kernel>]' -> (variant, decode_kernel; 'auto' when not given)."""
  variant, _, kernel = name.partition("@")
  return variant, kernel or "auto"


def compressed_loaded(loaded, name: str, group_size: int):
  """(Loaded with the experts of arm `name` ('<variant>[@<decode_kernel>]')
  converted from loaded's, the type's section)."""
  from moejax.interop.convert import Loaded
  from moejax.models.decoder import skeleton_decoder

  m = loaded.config
  dims = (m.d_model, m.moe.expert_d_ff, m.moe.num_experts, m.moe.top_k)
  variant, kernel = split_arm(name)
  expert_type, section = variant_settings(variant, dims, Settings(None, group_size, 0.5, 1, 0, 1))
  if expert_type not in ("quantized", "codebook"):
    return loaded, section
  section = {**section, "decode_kernel": kernel}
  c = ml_collections.ConfigDict(m.to_dict())
  c.moe.experts = expert_type
  c.moe[expert_type] = {
    **(c.moe.get(expert_type) or ml_collections.ConfigDict()).to_dict(),
    **section,
  }
  model = skeleton_decoder(c, rngs=nnx.Rngs(0))  # compress_model fills it
  from moejax.posttrain import compress

  compress.compress_model(loaded.model(), model, converter(expert_type, section))
  params, rest = (nnx.state(model, kind) for kind in (nnx.Param, nnx.Not(nnx.Param)))
  return Loaded(c, nnx.to_pure_dict(params), nnx.to_pure_dict(rest)), section


def merged(params, rest):
  """params and rest as one nested dict (what a step reads, trained or not)."""
  out = dict(params)
  for key, value in rest.items():
    out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
  return out


def variant_rows(loaded, model_name, variants, batches, prompt_len, new_tokens, reps, group_size):
  """Per batch and variant: prefill and decode tok/s (medians of `reps` runs, every
  variant interleaved with float32 in each round), ratios to float32, the weight
  bytes a decode step reads, this machine's read-rate bound and the fraction of
  tokens equal to float32's.

  Decode is measured twice: from whole generations, (N - 1) tokens over t(N) - t(1),
  which a long, jittery prefill distorts (its jitter lands in the difference), and
  directly, new_tokens - 1 decode steps in one compiled call after the prefill
  (generation.moejax_step's 'fused' timer: no prefill, no host loop; decode_step_*).
  The second is the check on the first; it is not generate's own decode (one loop
  program, not generate's chunks, and XLA:CPU may compile the two differently)."""
  from moejax.inference.generate import generate
  from moejax.profiling.generation import moejax_step
  from moejax.profiling.generation_profile import read_bandwidth

  arms = {REFERENCE: (loaded, {})}
  for variant in variants:
    start = time.perf_counter()
    arms[variant] = compressed_loaded(loaded, variant, group_size)
    print(f"{model_name} {variant}: converted in {time.perf_counter() - start:.1f} s", flush=True)
  bandwidth = read_bandwidth()
  rows = []
  for b in batches:
    prompts = np.random.default_rng(b).integers(3, loaded.config.vocab_size, (b, prompt_len))

    def run(arm, n, prompts=prompts):
      m, params, rest = arm.config, arm.params, arm.rest
      return generate(m, params, rest, prompts.tolist(), max_new_tokens=n)

    outs = {name: run(arm, new_tokens) for name, (arm, _) in arms.items()}  # compiles
    for arm, _ in arms.values():
      run(arm, 1)  # the one-token call's own cache bucket compiles too
    times = {
      n: medians(
        interleaved_times(
          {name: (lambda a=arm, n=n: run(a, n)) for name, (arm, _) in arms.items()}, reps
        )
      )
      for n in (1, new_tokens)
    }
    fused = {
      name: moejax_step(arm, prompts.tolist(), new_tokens, 1)[0]["fused"][0]
      for name, (arm, _) in arms.items()
    }
    step_times = medians(interleaved_times(fused, reps))
    for name, (arm, section) in arms.items():
      distinct = np.mean(outs[name].distinct_experts, axis=0)
      step_bytes = weight_bytes_per_step(merged(arm.params, arm.rest), distinct, b)
      first, full = times[1][name], times[new_tokens][name]
      row = {
        "model": model_name,
        "batch": b,
        "variant": name,
        "settings": section,
        "prefill_tok_s": b * prompt_len / first,
        "decode_tok_s": b * (new_tokens - 1) / max(full - first, 1e-9),
        "decode_step_tok_s": b * (new_tokens - 1) / step_times[name],
        "bytes_per_step": step_bytes,
        "read_bytes_per_s": bandwidth,
        "roofline_tok_s": b * bandwidth / step_bytes,
        "identical": float(np.mean(outs[name].tokens == outs[REFERENCE].tokens)),
      }
      rows.append(row)
    reference = rows[-len(arms)]
    for row in rows[-len(arms) :]:
      row["decode_ratio"] = row["decode_tok_s"] / reference["decode_tok_s"]
      row["decode_step_ratio"] = row["decode_step_tok_s"] / reference["decode_step_tok_s"]
      row["prefill_ratio"] = row["prefill_tok_s"] / reference["prefill_tok_s"]
      print(json.dumps(row), flush=True)
  return rows


def variant_table(rows) -> str:
  """The markdown table of variant_rows."""
  header = [
    "model", "batch", "experts", "decode tok/s", "decode ratio", "decode steps alone, tok/s",
    "ratio", "prefill tok/s", "prefill ratio", "MiB read / step", "roofline tok/s",
    "of roofline (steps alone)", "identical tokens",
  ]  # fmt: skip
  return markdown_table(
    header,
    [
      [
        r["model"],
        r["batch"],
        r["variant"],
        f"{r['decode_tok_s']:.0f}",
        f"{r['decode_ratio']:.2f}x",
        f"{r['decode_step_tok_s']:.0f}",
        f"{r['decode_step_ratio']:.2f}x",
        f"{r['prefill_tok_s']:.0f}",
        f"{r['prefill_ratio']:.2f}x",
        f"{r['bytes_per_step'] / 2**20:.2f}",
        f"{r['roofline_tok_s']:.0f}",
        f"{r['decode_step_tok_s'] / r['roofline_tok_s']:.2f}",
        f"{r['identical']:.3f}",
      ]
      for r in rows
    ],
  )
