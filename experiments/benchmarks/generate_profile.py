r"""Where a decode step's time goes, moejax against transformers:
`python -m experiments.benchmarks.generate --profile` (see that module's doc for
the parts and how each is measured). This module runs the measurements, which
generate_prefill_profile.py shares for --profile_phase=prefill; the moejax
step's HLO attribution and thunk traces are in moejax/profiling/xla_parts.py,
transformers' hooks in moejax/profiling/torch_parts.py, the tables in
moejax/profiling/report.py.
"""
import json
import os
import time

import numpy as np

from moejax.profiling.torch_parts import hf_parts, transformers_run
from moejax.profiling.xla_parts import add_loop_rest, blocked_times, median_profile, scoped_profile

def moejax_step(loaded, prompts, new_tokens: int, calls: int):
  """The generator's decode step after the prompt's prefill, as timers and a profile.

  timers {name: (fn, steps per call)}: 'step' the jitted one-token step
  (DecodePrograms.step; generate runs DECODE_CHUNK of them per call and the tail
  one by one); 'dispatch' a jitted function of the same signature (the same
  argument pytree) that does no work: the call's host cost; 'fold_in' the loop's
  other per-token call; 'fused' new_tokens - 1 steps in one call (fori_loop):
  device time without host. profile() -> one profiled run of `calls` calls: the
  step's XLA thunks by part (the step compiled again under named_scopes: the same
  ops, named), their span, and cost_analysis."""
  import jax
  import moejax.inference.generate as gen
  programs = gen.decode_programs(loaded.config)
  graphdef = programs.graphdef
  tokens, mask = gen.left_pad(prompts, 0, gen.prompt_bucket(len(prompts[0])))
  slots = -(-(tokens.shape[1] + new_tokens) // gen.CACHE_MULTIPLE) * gen.CACHE_MULTIPLE
  params, rest = loaded.params, loaded.rest
  logits, _, cache = programs.prefill(params, rest, tokens, mask, slots)
  key = jax.random.key(0)
  rng = jax.random.fold_in(key, 0)
  args = (params, rest, logits, rng, cache, 0.0, 0, 1.0)
  probe = jax.jit(lambda p, r, lg, k, c, *_: c.length + 1, static_argnums=(5, 6, 7))

  def fused_steps(params, rest, logits, cache):
    def body(i, carry):
      _, lg, _, c = gen.sample_and_forward(graphdef, params, rest, carry[0],
                                           jax.random.fold_in(key, i), carry[1], 0.0, 0, 1.0)
      return lg, c
    return jax.lax.fori_loop(0, new_tokens - 1, body, (logits, cache))
  fused = jax.jit(fused_steps)
  timers = {"step": (lambda: programs.step(*args), 1),
            "dispatch": (lambda: probe(*args), 1),
            "fold_in": (lambda: jax.random.fold_in(key, 3), 1),
            "fused": (lambda: fused(params, rest, logits, cache), new_tokens - 1)}
  for fn, _ in timers.values():
    jax.block_until_ready(fn())  # compile

  def scoped_step(*a):  # a new function: jax's trace cache holds the unscoped one
    return gen.sample_and_forward(graphdef, *a)
  return timers, scoped_profile(scoped_step, args, (5, 6, 7), calls)


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
  total, layer_experts, embed = 0.0, [], 0.0
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


def prompts_by_batch(hf_model, batches, prompt_len: int, torch_threads: int):
  """(batch, prompts int [batch, prompt_len] seeded by the batch) for each batch, with
  torch's threads set first (0: its default)."""
  import torch
  if torch_threads:
    torch.set_num_threads(torch_threads)
  for b in batches:
    yield b, np.random.default_rng(b).integers(3, hf_model.config.vocab_size, (b, prompt_len))


def profile_family(pair, family: str, batches, prompt_len: int, new_tokens: int, reps: int,
                   calls: int, torch_threads: int = 0) -> list:
  """Per batch: every timing, and a profiled run of the moejax step, in each of
  `reps` interleaved rounds; medians over the rounds."""
  import torch
  from moejax.inference.generate import generate
  hf_model, loaded = pair
  rows = []
  for b, prompts in prompts_by_batch(hf_model, batches, prompt_len, torch_threads):

    def ours(n):
      return generate(loaded.config, loaded.params, loaded.rest, prompts.tolist(),
                      max_new_tokens=n).tokens

    def theirs(n):
      with torch.no_grad():
        hf_model.generate(torch.as_tensor(prompts), do_sample=False, max_new_tokens=n,
                          min_new_tokens=n, attention_mask=torch.ones_like(
                              torch.as_tensor(prompts)), pad_token_id=0)

    theirs(new_tokens)  # warm up; and ours compiles, counting the experts each step uses
    distinct = generate(loaded.config, loaded.params, loaded.rest, prompts.tolist(),
                        max_new_tokens=new_tokens).distinct_experts.mean(axis=0)
    timers, profile = moejax_step(loaded, prompts.tolist(), new_tokens, calls)
    hf_run = transformers_run(hf_model, prompts.tolist(), new_tokens)
    samples, hooked, profiles = {}, [], []
    for _ in range(reps):
      start_of = {}
      for n in (1, new_tokens):
        for name, fn in (("ours", ours), ("theirs", theirs)):
          start = time.perf_counter()
          fn(n)
          start_of[name, n] = time.perf_counter() - start
      for name in ("ours", "theirs"):  # paired within the round
        samples.setdefault(f"{name}_loop", []).append(
            (start_of[name, new_tokens] - start_of[name, 1]) / (new_tokens - 1))
      for name, (fn, steps) in timers.items():
        samples.setdefault(name, []).extend(t / steps for t in blocked_times(
            fn, max(1, calls // steps)))
      plain = hf_run(False)
      samples.setdefault("hf_forward", []).extend(plain["forwards"])
      samples.setdefault("hf_gap", []).extend(plain["gaps"])
      hooked.append(hf_run(True))
      profiles.append(profile())
    med = {k: float(np.median(v)) for k, v in samples.items()}
    # the hooked run whose forwards' median is the median run's
    median_run = sorted(hooked, key=lambda h: np.median(h["forwards"]))[len(hooked) // 2]
    hooked_forward, hooked_parts = float(np.mean(median_run["forwards"])), median_run["parts"]
    ours_step = median_profile(profiles)
    loop = {"ours": med["ours_loop"], "theirs": med["hf_forward"] + med["hf_gap"]}
    # (a) the step's executable: its thunks' span in the profile (first start to last
    # end); (c) its thunks by part (each thunk's median) and the runtime between them
    device = ours_step["span_us"] * 1e-6
    if not device:  # no thunk named after an HLO instruction (not XLA:CPU): the step
      device = med["step"] - med["dispatch"]  # waited for, less a call doing no work
    thunks = {p: v * 1e-6 for p, v in ours_step["thunk_us"].items()}
    theirs_parts = hf_parts(hooked_parts, hooked_forward)  # per forward, mean
    row = {"family": family, "batch": b, "timings_s": med,
           "ours_loop_s": loop["ours"], "theirs_loop_s": loop["theirs"],
           "ours_device_s": device, "ours_host_s": loop["ours"] - device,
           "ours_parts_s": thunks,
           "ours_between_thunks_s": device - sum(thunks.values()),
           "ours_expert_loop_s": {k: v * 1e-6 for k, v in ours_step["expert_loop_us"].items()},
           "theirs_forward_s": med["hf_forward"], "theirs_forward_hooked_s": hooked_forward,
           "theirs_host_s": med["hf_gap"], "theirs_generate_loop_s": med["theirs_loop"],
           # the hooked modules' shares, scaled to the unhooked forward
           "theirs_parts_s": {p: med["hf_forward"] * v / hooked_forward
                              for p, v in theirs_parts.items()},
           "loadavg": os.getloadavg(), "distinct_experts_per_layer": distinct.tolist(),
           "weight_bytes_per_step": weight_bytes_per_step(loaded.params, distinct, b),
           "read_bytes_per_s": read_bandwidth(), "ours_profile": ours_step}
    add_loop_rest(row)
    print(json.dumps({k: row[k] for k in ("family", "batch", "ours_loop_s", "ours_device_s",
                                          "theirs_loop_s", "theirs_forward_s")}), flush=True)
    rows.append(row)
  return rows
