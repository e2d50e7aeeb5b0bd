r"""Where time to first token goes, moejax against transformers:
`python -m experiments.benchmarks.generate --profile --profile_phase=prefill`. The
parts and their attribution are the decode profile's (generate_profile.py and
moejax/profiling/, whose tracing, HLO attribution, transformers hooks and tables
this module uses); what is added:
moejax's prefill program profiled, transformers' first forward split, and the
useful matmul FLOP/s each reaches against one plain matmul of the prompt's rows.
"""
import json
import os
import time

import numpy as np

from experiments.benchmarks.generate_profile import prompts_by_batch
from moejax.profiling.torch_parts import hf_parts, transformers_run
from moejax.profiling.xla_parts import add_loop_rest, blocked_times, median_profile, scoped_profile


def moejax_prefill(loaded, prompts, new_tokens: int, calls: int):
  """The generator's prompt prefill (DecodePrograms.prefill: the empty cache made
  and the prompt fed, last position's logits) as a timer ('prefill': the jitted call
  waited for) and profile() as for the step (scoped_profile)."""
  import jax
  import moejax.inference.generate as gen
  programs = gen.decode_programs(loaded.config)
  tokens, mask = gen.left_pad(prompts, 0, gen.prompt_bucket(len(prompts[0])))
  slots = -(-(tokens.shape[1] + new_tokens) // gen.CACHE_MULTIPLE) * gen.CACHE_MULTIPLE
  params, rest = loaded.params, loaded.rest
  timers = {"prefill": (lambda: programs.prefill(params, rest, tokens, mask, slots), 1)}
  for fn, _ in timers.values():
    jax.block_until_ready(fn())  # compile

  def scoped_prefill(params, rest, tokens, mask):
    return gen._prefill(programs.config, programs.graphdef, params, rest, tokens, mask, slots)
  return timers, scoped_profile(scoped_prefill, (params, rest, tokens, mask), (), calls)


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
  jax.block_until_ready(mm(x, w))
  return 2.0 * rows * d * f / min(blocked_times(lambda: mm(x, w), reps))


def profile_prefill(pair, family: str, batches, prompt_len: int, new_tokens: int, reps: int,
                    calls: int, torch_threads: int = 0) -> list:
  """Per batch, where time to first token goes (--profile_phase=prefill): moejax's
  prefill program (its thunks by part, as the decode step's) and transformers'
  first forward inside its generate (hooked parts); the rest of each one's time to
  first token (generate(1), interleaved medians) is host work. Also the useful
  matmul FLOP/s each reaches against a plain matmul of the same rows."""
  from moejax.inference.generate import generate
  del new_tokens  # time to first token: generate with one new token, and its cache
  hf_model, loaded = pair
  rows = []
  for b, prompts in prompts_by_batch(hf_model, batches, prompt_len, torch_threads):

    def ours():
      return generate(loaded.config, loaded.params, loaded.rest, prompts.tolist(),
                      max_new_tokens=1).tokens

    hf_run = transformers_run(hf_model, prompts.tolist(), 1)
    hf_run(False)  # warm up
    ours()  # compile
    timers, profile = moejax_prefill(loaded, prompts.tolist(), 1, calls)
    samples, hooked, profiles = {}, [], []
    for _ in range(reps):
      for name, fn in (("ours_ttft", ours), ("theirs_ttft", lambda: hf_run(False))):
        start = time.perf_counter()
        out = fn()
        samples.setdefault(name, []).append(time.perf_counter() - start)
        if name == "theirs_ttft":
          samples.setdefault("hf_forward", []).append(out["prefill"])
      for name, (fn, _) in timers.items():
        samples.setdefault(name, []).extend(blocked_times(fn, calls))
      hooked.append(hf_run(True))
      profiles.append(profile())
    med = {k: float(np.median(v)) for k, v in samples.items()}
    median_run = sorted(hooked, key=lambda h: h["prefill"])[len(hooked) // 2]
    theirs_parts = hf_parts(median_run["prefill_parts"], median_run["prefill"])
    ours_profile = median_profile(profiles)
    device = ours_profile["span_us"] * 1e-6 or med["prefill"]
    thunks = {p: v * 1e-6 for p, v in ours_profile["thunk_us"].items()}
    m = loaded.config
    useful = matmul_flops_per_token(loaded.params, m.moe.top_k) * b * prompt_len
    row = {"family": family, "batch": b, "phase": "prefill", "prompt_len": prompt_len,
           "timings_s": med,
           "ours_loop_s": med["ours_ttft"], "theirs_loop_s": med["theirs_ttft"],
           "ours_device_s": device, "ours_host_s": med["ours_ttft"] - device,
           "ours_parts_s": thunks, "ours_between_thunks_s": device - sum(thunks.values()),
           "ours_expert_loop_s": {k: v * 1e-6
                                  for k, v in ours_profile["expert_loop_us"].items()},
           "theirs_forward_s": med["hf_forward"],
           "theirs_host_s": med["theirs_ttft"] - med["hf_forward"],
           "theirs_forward_hooked_s": median_run["prefill"],
           "theirs_parts_s": {p: med["hf_forward"] * v / median_run["prefill"]
                              for p, v in theirs_parts.items()},
           "useful_matmul_flops": useful,
           "plain_matmul_flops_per_s": plain_matmul_flops_per_s(b * prompt_len, m.d_model,
                                                                m.d_ff),
           "loadavg": os.getloadavg(), "ours_profile": ours_profile}
    add_loop_rest(row)
    print(json.dumps({k: row[k] for k in ("family", "batch", "ours_loop_s", "ours_device_s",
                                          "theirs_loop_s", "theirs_forward_s")}), flush=True)
    rows.append(row)
  return rows
