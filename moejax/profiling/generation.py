"""Generation against transformers on the same weights, the measurements of
`python -m experiments.benchmarks.generate` (its docstring lists the figures and
how each is taken): the model pair, the speed rows (prefill and decode tok/s,
identical tokens), and where a decode step's or the prefill's time goes, per part.

The moejax program's thunks are attributed by part in xla_parts.py, transformers'
modules are hooked in torch_parts.py, and report.py makes the tables.
"""

import json
import os
import tempfile
import time
from typing import Any

import numpy as np

from moejax.profiling.timing import blocked_times, interleaved_times, medians
from moejax.profiling.torch_parts import hf_parts, transformers_run
from moejax.profiling.xla_parts import add_loop_rest, median_profile, scoped_profile

FAMILIES = ("qwen3_moe", "deepseek_v3")
SIZE: dict[str, Any] = dict(
  vocab_size=4096,
  hidden_size=256,
  num_hidden_layers=4,
  num_attention_heads=8,
  num_key_value_heads=4,
  max_position_embeddings=1024,
  bos_token_id=1,
  eos_token_id=2,
  pad_token_id=0,
)


def hf_config(family: str):
  """The benchmark's small random model of a family (one of FAMILIES): hidden 256,
  4 layers, 16 routed experts of width 256, top-4, vocab 4096."""
  import transformers as tf

  if family == "qwen3_moe":
    return tf.Qwen3MoeConfig(  # type: ignore[call-arg]  # head_dim: a PreTrainedConfig kwarg
      **SIZE,
      head_dim=32,
      intermediate_size=1024,
      moe_intermediate_size=256,
      num_experts=16,
      num_experts_per_tok=4,
      norm_topk_prob=True,
    )
  return tf.DeepseekV3Config(
    **{**SIZE, "num_key_value_heads": SIZE["num_attention_heads"]},
    intermediate_size=1024,
    moe_intermediate_size=256,
    n_routed_experts=16,
    n_shared_experts=1,
    num_experts_per_tok=4,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    kv_lora_rank=64,
    q_lora_rank=96,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
  )


def model_pair(family: str):
  """(transformers model, moejax import of the same weights)."""
  import torch
  import transformers
  from moejax.interop.convert import import_hf

  torch.manual_seed(0)
  hf_model = transformers.AutoModelForCausalLM.from_config(
    hf_config(family), attn_implementation="eager"
  ).eval()
  with tempfile.TemporaryDirectory() as directory:
    hf_model.save_pretrained(directory)
    loaded = import_hf(directory)
  return hf_model, loaded


def prompts_by_batch(hf_model, batches, prompt_len: int, torch_threads: int = 0):
  """(batch, prompts int [batch, prompt_len] seeded by the batch) for each batch, with
  torch's threads set first (0: its default)."""
  import torch

  if torch_threads:
    torch.set_num_threads(torch_threads)
  for b in batches:
    yield b, np.random.default_rng(b).integers(3, hf_model.config.vocab_size, (b, prompt_len))


def generators(pair, prompts):
  """(ours(n), theirs(n)): each side's greedy generation of exactly n new tokens."""
  import torch
  from moejax.inference.generate import generate

  hf_model, loaded = pair

  def ours(n):
    return generate(
      loaded.config, loaded.params, loaded.rest, prompts.tolist(), max_new_tokens=n
    ).tokens

  def theirs(n):
    with torch.no_grad():
      out = hf_model.generate(
        torch.as_tensor(prompts),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=n,
        attention_mask=torch.ones_like(torch.as_tensor(prompts)),
        pad_token_id=0,
      )
    return out[:, prompts.shape[1] :].numpy()

  return ours, theirs


def speed_rows(pair, family: str, batches, prompt_len: int, new_tokens: int, reps: int) -> list:
  """Per batch: time to first token, prefill and decode tok/s of each side (medians
  of `reps` interleaved runs), their ratios, and the fraction of identical tokens."""
  rows = []
  for b, prompts in prompts_by_batch(pair[0], batches, prompt_len):
    ours, theirs = generators(pair, prompts)
    # untimed: compiles moejax's prefill and decode step (one cache bucket for both n)
    identical = float(np.mean(ours(new_tokens) == theirs(new_tokens)))
    times = {
      n: medians(
        interleaved_times({"ours": lambda n=n: ours(n), "theirs": lambda n=n: theirs(n)}, reps)
      )
      for n in (1, new_tokens)
    }
    row = {"family": family, "batch": b, "identical": identical}
    for name in ("ours", "theirs"):
      first, full = times[1][name], times[new_tokens][name]
      row[f"{name}_ttft_s"] = first
      row[f"{name}_prefill_tok_s"] = b * prompt_len / first
      row[f"{name}_decode_tok_s"] = b * (new_tokens - 1) / max(full - first, 1e-9)
    row["prefill_ratio"] = row["ours_prefill_tok_s"] / row["theirs_prefill_tok_s"]
    row["decode_ratio"] = row["ours_decode_tok_s"] / row["theirs_decode_tok_s"]
    print(json.dumps(row), flush=True)
    rows.append(row)
  return rows


def _prefilled(loaded, prompts, new_tokens: int):
  """(decode programs, left-padded tokens, mask, cache slots) as generate makes them."""
  import moejax.inference.generate as gen

  programs = gen.decode_programs(loaded.config)
  tokens, mask = gen.left_pad(prompts, 0, gen.prompt_bucket(len(prompts[0])))
  slots = -(-(tokens.shape[1] + new_tokens) // gen.CACHE_MULTIPLE) * gen.CACHE_MULTIPLE
  return programs, tokens, mask, slots


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

  programs, tokens, mask, slots = _prefilled(loaded, prompts, new_tokens)
  graphdef, params, rest = programs.graphdef, loaded.params, loaded.rest
  logits, _, cache = programs.prefill(params, rest, tokens, mask, slots)
  key = jax.random.key(0)
  args = (params, rest, logits, jax.random.fold_in(key, 0), cache, 0.0, 0, 1.0)
  probe = jax.jit(lambda p, r, lg, k, c, *_: c.length + 1, static_argnums=(5, 6, 7))

  def fused_steps(params, rest, logits, cache):
    def body(i, carry):
      _, lg, _, c = gen.sample_and_forward(
        graphdef, params, rest, carry[0], jax.random.fold_in(key, i), carry[1], 0.0, 0, 1.0
      )
      return lg, c

    return jax.lax.fori_loop(0, new_tokens - 1, body, (logits, cache))

  fused = jax.jit(fused_steps)
  timers = {
    "step": (lambda: programs.step(*args), 1),
    "dispatch": (lambda: probe(*args), 1),
    "fold_in": (lambda: jax.random.fold_in(key, 3), 1),
    "fused": (lambda: fused(params, rest, logits, cache), new_tokens - 1),
  }
  for fn, _ in timers.values():
    blocked_times(fn, 1)  # compile

  def scoped_step(*a):  # a new function: jax's trace cache holds the unscoped one
    return gen.sample_and_forward(graphdef, *a)

  return timers, scoped_profile(scoped_step, args, (5, 6, 7), calls)


def moejax_prefill(loaded, prompts, new_tokens: int, calls: int):
  """The generator's prompt prefill (DecodePrograms.prefill: the empty cache made
  and the prompt fed, last position's logits) as a timer ('prefill': the jitted call
  waited for) and profile() as for the step (scoped_profile)."""
  import moejax.inference.generate as gen

  programs, tokens, mask, slots = _prefilled(loaded, prompts, new_tokens)
  params, rest = loaded.params, loaded.rest
  timers = {"prefill": (lambda: programs.prefill(params, rest, tokens, mask, slots), 1)}
  blocked_times(timers["prefill"][0], 1)  # compile

  def scoped_prefill(params, rest, tokens, mask):
    return gen._prefill(programs.config, programs.graphdef, params, rest, tokens, mask, slots)

  return timers, scoped_profile(scoped_prefill, (params, rest, tokens, mask), (), calls)


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
