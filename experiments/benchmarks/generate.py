r"""Generation speed against transformers on the same model (issue 17, part 1).

  python -m experiments.benchmarks.generate [--families=qwen3_moe,deepseek_v3]
      [--batches=1,8,32] [--prompt_len=32] [--new_tokens=32] [--reps=3]
      [--json=FILE] [--markdown=FILE]

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
"""
import datetime
import json
import os
import platform
import tempfile
import time

from absl import app, flags
import numpy as np

from moejax import cli

_FAMILIES = flags.DEFINE_list("families", ["qwen3_moe", "deepseek_v3"], "HF families.")
_BATCHES = cli.checked(flags.DEFINE_list("batches", ["1", "8", "32"], "Batch sizes."),
                       cli.at_least(1))
_PROMPT = cli.checked(flags.DEFINE_integer("prompt_len", 32, "Prompt tokens."), cli.at_least(1))
_NEW = cli.checked(flags.DEFINE_integer("new_tokens", 32, "Generated tokens."), cli.at_least(2))
_REPS = cli.checked(flags.DEFINE_integer("reps", 3, "Timed repetitions."), cli.at_least(1))
_JSON = flags.DEFINE_string("json", None, "Write the figures here.")
_MARKDOWN = flags.DEFINE_string("markdown", None, "Write the table here.")

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


def bench_family(family: str, batches, prompt_len: int, new_tokens: int, reps: int) -> list:
  import torch
  import transformers
  from moejax.inference.generate import generate
  from moejax.interop.convert import import_hf
  torch.manual_seed(0)
  hf_model = transformers.AutoModelForCausalLM.from_config(
      hf_config(family), attn_implementation="eager").eval()
  with tempfile.TemporaryDirectory() as directory:
    hf_model.save_pretrained(directory)
    loaded = import_hf(directory)
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
  lines = ["| family | batch | prefill tok/s moejax / transformers (ratio) | decode tok/s "
           "moejax / transformers (ratio) | time to first token, s | identical tokens |",
           "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['family']} | {r['batch']} | {r['ours_prefill_tok_s']:.0f} / "
                 f"{r['theirs_prefill_tok_s']:.0f} ({r['prefill_ratio']:.2f}x) | "
                 f"{r['ours_decode_tok_s']:.0f} / {r['theirs_decode_tok_s']:.0f} "
                 f"({r['decode_ratio']:.2f}x) | {r['ours_ttft_s']:.3f} / {r['theirs_ttft_s']:.3f}"
                 f" | {r['identical']:.3f} |")
  return "\n".join(lines)


def main(argv):
  del argv
  for family in _FAMILIES.value:
    hf_config(family)  # refuse an unknown family before any work
  rows = []
  for family in _FAMILIES.value:
    rows += bench_family(family, [int(b) for b in _BATCHES.value], _PROMPT.value,
                         _NEW.value, _REPS.value)
  text = table(rows)
  print(text)
  meta = {"date": datetime.date.today().isoformat(), "machine": platform.machine(),
          "cpus": os.cpu_count(), "prompt_len": _PROMPT.value, "new_tokens": _NEW.value,
          "reps": _REPS.value}
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump({"meta": meta, "rows": rows}, f, indent=1)
  if _MARKDOWN.value:
    with open(_MARKDOWN.value, "w") as f:
      f.write(f"{meta}\n\n{text}\n")


if __name__ == "__main__":
  cli.run(main)
