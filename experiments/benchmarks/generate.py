r"""Generation speed against transformers on the same model.

  python -m experiments.benchmarks.generate [--families=qwen3_moe,deepseek_v3]
      [--batches=1,8,32] [--prompt_len=32] [--new_tokens=32] [--reps=3]
      [--json=FILE] [--markdown=FILE]
  python -m experiments.benchmarks.generate --profile --families=qwen3_moe --batches=1,8
      [--profile_phase=decode|prefill] [--reps=7] [--profile_calls=30]
      [--profile_torch_threads=1] [--json=FILE]

For each family, transformers builds a small random model (hidden 256, 4
layers, 16 routed experts of width 256, top-4, vocab 4096: tens of millions of
FLOPs per token), saves it, and moejax imports the same weights. Both generate
greedily from the same prompts (batch B, all of length --prompt_len, no
padding), float32, eager attention for transformers. Per family and batch:

  prefill tok/s   B * prompt_len / time to first token (one generated token)
  decode tok/s    B * (N - 1) / (time for N tokens - time for 1)
  identical       fraction of generated tokens equal to transformers' tokens

and the ratios moejax / transformers. Each measurement is the median of
--reps runs, interleaved (moejax, transformers, moejax, ...) on this shared
machine; moejax is compiled by an untimed call first (generation compiles once
per prompt bucket and cache bucket: moejax/inference/generate.py).

--profile (where the time goes) replaces the speed table by a
decode step's time split into parts, per family and batch, in ms per step:

  moejax        (a) the compiled one-token decode step (DecodePrograms.step): in a
                jax.profiler trace, from its first XLA:CPU thunk's start to its last one's
                end (median of --profile_calls calls); (b) host: generate's
                per-token time - (a) (the jit call, fold_in, the Python loop:
                what async dispatch does not hide); (c) inside (a): its thunks,
                each attributed by its HLO op_name (module calls are wrapped in
                jax.named_scope while the step is compiled again: the same ops,
                named) and source frame to attention, MoE router / dispatch /
                experts, norms, embedding, LM head, sampling; the MoE expert
                loops also by their bodies' thunks (matmuls, expert weight
                slices, row gather/scatter, loop runtime); the remainder of (a)
                is XLA's runtime between thunks.
  transformers  (a) its model's forward inside its own generate (hooks on the
                top module, prefill left out); (b) generate's work between two
                forwards; (c) forward hooks on each part's module (shares scaled
                to the unhooked forward).

plus the parameter bytes one step reads and the time one core takes to read
them. --profile_phase=prefill splits time to first token the same way: moejax's
prefill program (DecodePrograms.prefill) by part, the host around it (time to
first token - the program); transformers' first forward by part, generate's
work around it; with the useful matmul FLOP/s each reaches against one plain
matmul of the prompt's rows. --profile_torch_threads=1 on a busy shared machine
(see the flag).
"""
import datetime
import json
import os
import platform
import tempfile
import time

from absl import flags
import numpy as np

from moejax import cli
from moejax.evaluation.stats import markdown_table

_FAMILIES = flags.DEFINE_list("families", ["qwen3_moe", "deepseek_v3"], "HF families.")
_BATCHES = cli.checked(flags.DEFINE_list("batches", ["1", "8", "32"], "Batch sizes."),
                       cli.at_least(1))
_PROMPT = cli.checked(flags.DEFINE_integer("prompt_len", 32, "Prompt tokens."), cli.at_least(1))
_NEW = cli.checked(flags.DEFINE_integer("new_tokens", 32, "Generated tokens."), cli.at_least(2))
_REPS = cli.checked(flags.DEFINE_integer("reps", 3, "Timed repetitions."), cli.at_least(1))
_JSON = flags.DEFINE_string("json", None, "Write the figures here.")
_MARKDOWN = flags.DEFINE_string("markdown", None, "Write the table here.")
_PROFILE = flags.DEFINE_bool(
    "profile", False, "Instead of the speed table: where a decode step's time goes, per "
    "family and batch (moejax: the compiled step's device time split by part from the XLA "
    "profiler, its dispatch, the host loop; transformers: the forward split by module hooks, "
    "generate's loop). --json/--markdown get these figures.")
_PHASE = flags.DEFINE_enum(
    "profile_phase", "decode", ["decode", "prefill"], "--profile: a decode step, or the "
    "prefill (time to first token: moejax's prefill program by part and the host around it; "
    "transformers' first forward by part and generate's set-up).")
_CALLS = cli.checked(flags.DEFINE_integer("profile_calls", 30, "--profile: timed calls of the "
                                          "moejax step per round (median)."), cli.at_least(1))
_TORCH_THREADS = cli.checked(flags.DEFINE_integer(
    "profile_torch_threads", 0, "--profile: torch.set_num_threads (0: torch's default). On a "
    "shared, busy machine torch's two threads wait on each other (5x slower decode here "
    "under a load of 6); one thread measures its work instead."), cli.at_least(0))

SIZE = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, max_position_embeddings=1024, bos_token_id=1,
            eos_token_id=2, pad_token_id=0)


def hf_config(family: str):
  import transformers as tf
  if family == "qwen3_moe":
    return tf.Qwen3MoeConfig(**SIZE, head_dim=32, intermediate_size=1024,
                             moe_intermediate_size=256, num_experts=16, num_experts_per_tok=4,
                             norm_topk_prob=True)
  if family == "deepseek_v3":
    return tf.DeepseekV3Config(**{**SIZE, "num_key_value_heads": SIZE["num_attention_heads"]},
                               intermediate_size=1024, moe_intermediate_size=256,
                               n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4,
                               n_group=4, topk_group=2, first_k_dense_replace=1,
                               kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16,
                               qk_nope_head_dim=32, v_head_dim=32,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
  raise cli.flag_error(_FAMILIES, f"expected qwen3_moe or deepseek_v3, not {family!r}")


def model_pair(family: str):
  """(transformers model, moejax import of the same weights)."""
  import torch
  import transformers
  from moejax.interop.convert import import_hf
  torch.manual_seed(0)
  hf_model = transformers.AutoModelForCausalLM.from_config(
      hf_config(family), attn_implementation="eager").eval()
  with tempfile.TemporaryDirectory() as directory:
    hf_model.save_pretrained(directory)
    loaded = import_hf(directory)
  return hf_model, loaded


def bench_family(family: str, batches, prompt_len: int, new_tokens: int, reps: int) -> list:
  import torch
  from moejax.inference.generate import generate
  hf_model, loaded = model_pair(family)
  rows = []
  for b in batches:
    prompts = np.random.default_rng(b).integers(3, SIZE["vocab_size"], (b, prompt_len))

    def ours(n):
      return generate(loaded.config, loaded.params, loaded.rest, prompts.tolist(),
                      max_new_tokens=n).tokens

    def theirs(n):
      with torch.no_grad():
        out = hf_model.generate(torch.as_tensor(prompts), do_sample=False, max_new_tokens=n,
                                min_new_tokens=n, attention_mask=torch.ones_like(
                                    torch.as_tensor(prompts)), pad_token_id=0)
      return out[:, prompt_len:].numpy()

    # untimed: compiles moejax's prefill and decode step (one cache bucket for both n)
    identical = float(np.mean(ours(new_tokens) == theirs(new_tokens)))
    times = {"ours": {}, "theirs": {}}
    for n in (1, new_tokens):  # medians of interleaved runs
      samples = {"ours": [], "theirs": []}
      for _ in range(reps):
        for name, fn in (("ours", ours), ("theirs", theirs)):
          start = time.perf_counter()
          fn(n)
          samples[name].append(time.perf_counter() - start)
      for name, values in samples.items():
        times[name][n] = float(np.median(values))
    row = {"family": family, "batch": b, "identical": identical}
    for name in ("ours", "theirs"):
      first, full = times[name][1], times[name][new_tokens]
      row[f"{name}_ttft_s"] = first
      row[f"{name}_prefill_tok_s"] = b * prompt_len / first
      row[f"{name}_decode_tok_s"] = b * (new_tokens - 1) / max(full - first, 1e-9)
    row["prefill_ratio"] = row["ours_prefill_tok_s"] / row["theirs_prefill_tok_s"]
    row["decode_ratio"] = row["ours_decode_tok_s"] / row["theirs_decode_tok_s"]
    print(json.dumps(row), flush=True)
    rows.append(row)
  return rows


def table(rows) -> str:
  return markdown_table(
      ["family", "batch", "prefill tok/s moejax / transformers (ratio)",
       "decode tok/s moejax / transformers (ratio)", "time to first token, s",
       "identical tokens"],
      [[r["family"], r["batch"],
        f"{r['ours_prefill_tok_s']:.0f} / {r['theirs_prefill_tok_s']:.0f} "
        f"({r['prefill_ratio']:.2f}x)",
        f"{r['ours_decode_tok_s']:.0f} / {r['theirs_decode_tok_s']:.0f} "
        f"({r['decode_ratio']:.2f}x)",
        f"{r['ours_ttft_s']:.3f} / {r['theirs_ttft_s']:.3f}", f"{r['identical']:.3f}"]
       for r in rows])


def main(argv):
  del argv
  for family in _FAMILIES.value:
    hf_config(family)  # refuse an unknown family before any work
  if _PHASE.value != "decode" and not _PROFILE.value:
    raise cli.flag_error(_PHASE, "chooses what --profile measures; give --profile too")
  rows = []
  batches = [int(b) for b in _BATCHES.value]
  if _PROFILE.value and _PHASE.value == "prefill":
    from experiments.benchmarks.generate_prefill_profile import profile_prefill as profile
    from moejax.profiling.report import prefill_table as profile_table
  elif _PROFILE.value:
    from experiments.benchmarks.generate_profile import profile_family as profile
    from moejax.profiling.report import profile_table
  for family in _FAMILIES.value:
    if _PROFILE.value:
      rows += profile(model_pair(family), family, batches, _PROMPT.value, _NEW.value,
                      _REPS.value, _CALLS.value, _TORCH_THREADS.value)
    else:
      rows += bench_family(family, batches, _PROMPT.value, _NEW.value, _REPS.value)
  text = profile_table(rows) if _PROFILE.value else table(rows)
  print(text)
  meta = {"date": datetime.date.today().isoformat(), "machine": platform.machine(),
          "cpus": os.cpu_count(), "prompt_len": _PROMPT.value, "new_tokens": _NEW.value,
          "reps": _REPS.value, "loadavg": os.getloadavg()}
  if _PROFILE.value:
    import jax
    import torch
    meta.update(profile_calls=_CALLS.value, jax=jax.__version__, backend=jax.default_backend(),
                torch=torch.__version__, torch_threads=torch.get_num_threads())
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump({"meta": meta, "rows": rows}, f, indent=1)
  if _MARKDOWN.value:
    with open(_MARKDOWN.value, "w") as f:
      f.write(f"{meta}\n\n{text}\n")


if __name__ == "__main__":
  cli.run(main)
