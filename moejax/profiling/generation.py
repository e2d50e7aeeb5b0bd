"""Generation against transformers on the same weights, the measurements of
`python -m experiments.benchmarks.generate` (its docstring lists the figures and
how each is taken): the model pair and the speed rows (prefill and decode tok/s,
identical tokens). Where a decode step's or the prefill's time goes, per part, is
generation_profile.py.

The moejax program's thunks are attributed by part in xla_parts.py, transformers'
modules are hooked in torch_parts.py, and report.py makes the tables.
"""

import json
import tempfile
from typing import Any

import jax.numpy as jnp
import numpy as np

from moejax.profiling.timing import blocked_times, interleaved_times, medians
from moejax.profiling.xla_parts import scoped_profile

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


def model_pair(family: str, dtype: str = "float32"):
  """(transformers model, moejax import of the same weights), both holding and computing
  in `dtype` ('float32' or 'bfloat16': the float32 weights rounded to bfloat16 on each
  side; moejax's router math stays float32)."""
  import torch
  import transformers
  from moejax.interop.convert import import_hf

  torch.manual_seed(0)
  hf_model = transformers.AutoModelForCausalLM.from_config(
    hf_config(family), attn_implementation="eager"
  ).eval()
  with tempfile.TemporaryDirectory() as directory:
    hf_model.save_pretrained(directory)
    loaded = import_hf(directory, param_dtype=dtype)
  loaded.config.dtype = dtype
  return hf_model.to(getattr(torch, dtype)), loaded


def first_divergence(pair, prompts, ours_tokens, theirs_tokens) -> dict | None:
  """Where the two greedy generations first differ (the earliest step, then the first
  row), with both models' logits there for both candidate tokens, each side's full
  forward on the prompt and the shared tokens before it; None when they agree."""
  import torch

  differ = np.asarray(ours_tokens) != np.asarray(theirs_tokens)
  if not differ.any():
    return None
  step = int(np.min(np.nonzero(differ)[1]))
  row = int(np.nonzero(differ[:, step])[0][0])
  context = np.concatenate([prompts[row], np.asarray(ours_tokens)[row, :step]])[None]
  hf_model, loaded = pair
  ours = np.asarray(loaded.model()(jnp.asarray(context, jnp.int32))[0][0, -1], np.float32)
  with torch.no_grad():
    theirs = hf_model(torch.as_tensor(context)).logits[0, -1].float().numpy()
  chosen = {"moejax": int(ours_tokens[row][step]), "transformers": int(theirs_tokens[row][step])}
  return {
    "row": row,
    "step": step,
    "tokens": chosen,
    "moejax_logits": {side: float(ours[t]) for side, t in chosen.items()},
    "transformers_logits": {side: float(theirs[t]) for side, t in chosen.items()},
  }


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
    ours_tokens, theirs_tokens = ours(new_tokens), theirs(new_tokens)
    identical = float(np.mean(ours_tokens == theirs_tokens))
    divergence = first_divergence(pair, prompts, ours_tokens, theirs_tokens)
    times = {
      n: medians(
        interleaved_times({"ours": lambda n=n: ours(n), "theirs": lambda n=n: theirs(n)}, reps)
      )
      for n in (1, new_tokens)
    }
    row = {"family": family, "batch": b, "identical": identical}
    if divergence is not None:
      row["first_divergence"] = divergence
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
