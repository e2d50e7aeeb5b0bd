"""Where a decode step's or the prefill's time goes, per part, for moejax and for
transformers on the same weights (`python -m experiments.benchmarks.generate --profile`),
with the roofline figures beside them: bytes of weights read per step, matmul FLOPs
per token, and this machine's read bandwidth and plain matmul rate.

The set-up (model pair, prompts, prefilled caches) is generation.py's.
"""

import json
import os
import time

import numpy as np

from moejax.profiling.generation import (
  generators,
  moejax_prefill,
  moejax_step,
  prompts_by_batch,
)
from moejax.profiling.timing import blocked_times, medians
from moejax.profiling.torch_parts import hf_parts, transformers_run
from moejax.profiling.xla_parts import add_loop_rest, median_profile


def read_bandwidth() -> float:
  """Bytes per second one core reads (numpy sum of 256 MiB float32, best of 7)."""
  a = np.ones(2**26, np.float32)
  best = float("inf")
  for _ in range(7):
    start = time.perf_counter()
    a.sum()
    best = min(best, time.perf_counter() - start)
  return a.nbytes / best


def weight_bytes_per_step(params, distinct_per_layer, batch: int) -> float:
  """Parameter bytes one decode step must read: every weight except the expert
  stacks and the embedding table, the experts each MoE layer activated (measured),
  and the batch's embedding rows."""
  import jax

  total, embed = 0.0, 0.0
  layer_experts: list[list] = []  # [MoE layer, bytes per expert]
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    key = jax.tree_util.keystr(path)
    nbytes = float(np.asarray(leaf).nbytes)
    if "['experts']" in key:
      layer = key.split("['experts']")[0]
      if not layer_experts or layer_experts[-1][0] != layer:
        layer_experts.append([layer, 0.0])
      layer_experts[-1][1] += nbytes / leaf.shape[0]  # per expert
    elif key == "['embed']":
      embed = nbytes / leaf.shape[0]
    else:
      total += nbytes
  total += sum(per_expert * d for (_, per_expert), d in zip(layer_experts, distinct_per_layer))
  return total + batch * embed


def matmul_flops_per_token(params, top_k: int) -> float:
  """2 x the weights one token multiplies in a forward: every parameter but the
  embedding table, the routed expert stacks at top_k of their E experts."""
  import jax

  total = 0.0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    key = jax.tree_util.keystr(path)
    if key != "['embed']":
      total += leaf.size * (top_k / leaf.shape[0] if "['experts']" in key else 1.0)
  return 2.0 * total


def plain_matmul_flops_per_s(rows: int, d: int, f: int, reps: int = 7) -> float:
  """FLOP/s of one jitted float32 [rows, d] @ [d, f] here (best of reps): what a
  plain matmul of the prefill's rows reaches on this CPU."""
  import jax
  import jax.numpy as jnp

  x, w = jnp.ones((rows, d), jnp.float32), jnp.ones((d, f), jnp.float32)
  mm = jax.jit(jnp.matmul)
  blocked_times(lambda: mm(x, w), 1)
  return 2.0 * rows * d * f / min(blocked_times(lambda: mm(x, w), reps))


def _profile_row(
  family: str,
  batch: int,
  med: dict,
  loops: tuple,
  device: float,
  ours_profile: dict,
  theirs_host: float,
  hooked: tuple,
  **extra,
) -> dict:
  """The row of a profiled batch: loops (ours, theirs) is each side's time per
  token (decode) or to first token (prefill); device the moejax program's time;
  hooked (forward time, parts) transformers' hooked forward, its parts scaled to
  the unhooked forward med['hf_forward']; the rest of each side's time is host."""
  thunks = {p: v * 1e-6 for p, v in ours_profile["thunk_us"].items()}
  hooked_forward, hooked_parts = hooked
  row = {
    "family": family,
    "batch": batch,
    **extra,
    "timings_s": med,
    "ours_loop_s": loops[0],
    "theirs_loop_s": loops[1],
    "ours_device_s": device,
    "ours_host_s": loops[0] - device,
    "ours_parts_s": thunks,
    "ours_between_thunks_s": device - sum(thunks.values()),
    "ours_expert_loop_s": {k: v * 1e-6 for k, v in ours_profile["expert_loop_us"].items()},
    "theirs_forward_s": med["hf_forward"],
    "theirs_forward_hooked_s": hooked_forward,
    "theirs_host_s": theirs_host,
    "theirs_parts_s": {
      p: med["hf_forward"] * v / hooked_forward
      for p, v in hf_parts(hooked_parts, hooked_forward).items()
    },
    "loadavg": os.getloadavg(),
    "ours_profile": ours_profile,
  }
  add_loop_rest(row)
  print(
    json.dumps(
      {
        k: row[k]
        for k in (
          "family",
          "batch",
          "ours_loop_s",
          "ours_device_s",
          "theirs_loop_s",
          "theirs_forward_s",
        )
      }
    ),
    flush=True,
  )
  return row


def profile_decode(
  pair,
  family: str,
  batches,
  prompt_len: int,
  new_tokens: int,
  reps: int,
  calls: int,
  torch_threads: int = 0,
) -> list:
  """Per batch, where a decode step's time goes: every timing, and a profiled run
  of the moejax step, in each of `reps` interleaved rounds; medians over the rounds."""
  from moejax.inference.generate import generate

  hf_model, loaded = pair
  rows = []
  for b, prompts in prompts_by_batch(hf_model, batches, prompt_len, torch_threads):
    ours, theirs = generators(pair, prompts)
    theirs(new_tokens)  # warm up; and ours compiles, counting the experts each step uses
    distinct = generate(
      loaded.config, loaded.params, loaded.rest, prompts.tolist(), max_new_tokens=new_tokens
    ).distinct_experts.mean(axis=0)
    timers, profile = moejax_step(loaded, prompts.tolist(), new_tokens, calls)
    hf_run = transformers_run(hf_model, prompts.tolist(), new_tokens)
    samples: dict[str, list[float]] = {}
    hooked, profiles = [], []
    for _ in range(reps):
      once = {
        (name, n): blocked_times(lambda: fn(n), 1)[0]
        for n in (1, new_tokens)
        for name, fn in (("ours", ours), ("theirs", theirs))
      }
      for name in ("ours", "theirs"):  # paired within the round
        samples.setdefault(f"{name}_loop", []).append(
          (once[name, new_tokens] - once[name, 1]) / (new_tokens - 1)
        )
      for name, (fn, steps) in timers.items():
        samples.setdefault(name, []).extend(
          t / steps for t in blocked_times(fn, max(1, calls // steps))
        )
      plain = hf_run(False)
      samples.setdefault("hf_forward", []).extend(plain["forwards"])
      samples.setdefault("hf_gap", []).extend(plain["gaps"])
      hooked.append(hf_run(True))
      profiles.append(profile())
    med = medians(samples)
    # the hooked run whose forwards' median is the median run's
    median_run = sorted(hooked, key=lambda h: np.median(h["forwards"]))[len(hooked) // 2]
    ours_step = median_profile(profiles)
    # (a) the step's executable: its thunks' span in the profile (first start to last
    # end); (c) its thunks by part (each thunk's median) and the runtime between them
    device = ours_step["span_us"] * 1e-6
    if not device:  # no thunk named after an HLO instruction (not XLA:CPU): the step
      device = med["step"] - med["dispatch"]  # waited for, less a call doing no work
    rows.append(
      _profile_row(
        family,
        b,
        med,
        (med["ours_loop"], med["hf_forward"] + med["hf_gap"]),
        device,
        ours_step,
        med["hf_gap"],
        (float(np.mean(median_run["forwards"])), median_run["parts"]),
        theirs_generate_loop_s=med["theirs_loop"],
        distinct_experts_per_layer=distinct.tolist(),
        weight_bytes_per_step=weight_bytes_per_step(loaded.params, distinct, b),
        read_bytes_per_s=read_bandwidth(),
      )
    )
  return rows


def profile_prefill(
  pair,
  family: str,
  batches,
  prompt_len: int,
  new_tokens: int,
  reps: int,
  calls: int,
  torch_threads: int = 0,
) -> list:
  """Per batch, where time to first token goes: moejax's prefill program (its
  thunks by part, as the decode step's) and transformers' first forward inside its
  generate (hooked parts); the rest of each one's time to first token (generate(1),
  interleaved medians) is host work. Also the useful matmul FLOP/s each reaches
  against a plain matmul of the same rows."""
  del new_tokens  # time to first token: generate with one new token, and its cache
  hf_model, loaded = pair
  rows = []
  for b, prompts in prompts_by_batch(hf_model, batches, prompt_len, torch_threads):
    ours, _ = generators(pair, prompts)
    hf_run = transformers_run(hf_model, prompts.tolist(), 1)
    hf_run(False)  # warm up
    ours(1)  # compile
    timers, profile = moejax_prefill(loaded, prompts.tolist(), 1, calls)
    samples: dict[str, list[float]] = {}
    hooked, profiles = [], []
    for _ in range(reps):
      samples.setdefault("ours_ttft", []).extend(blocked_times(lambda: ours(1), 1))
      start = time.perf_counter()
      plain = hf_run(False)
      samples.setdefault("theirs_ttft", []).append(time.perf_counter() - start)
      samples.setdefault("hf_forward", []).append(plain["prefill"])
      for name, (fn, _) in timers.items():
        samples.setdefault(name, []).extend(blocked_times(fn, calls))
      hooked.append(hf_run(True))
      profiles.append(profile())
    med = medians(samples)
    median_run = sorted(hooked, key=lambda h: h["prefill"])[len(hooked) // 2]
    ours_profile = median_profile(profiles)
    m = loaded.config
    rows.append(
      _profile_row(
        family,
        b,
        med,
        (med["ours_ttft"], med["theirs_ttft"]),
        ours_profile["span_us"] * 1e-6 or med["prefill"],
        ours_profile,
        med["theirs_ttft"] - med["hf_forward"],
        (median_run["prefill"], median_run["prefill_parts"]),
        phase="prefill",
        prompt_len=prompt_len,
        useful_matmul_flops=matmul_flops_per_token(loaded.params, m.moe.top_k) * b * prompt_len,
        plain_matmul_flops_per_s=plain_matmul_flops_per_s(b * prompt_len, m.d_model, m.d_ff),
      )
    )
  return rows
