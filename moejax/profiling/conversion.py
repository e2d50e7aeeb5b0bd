"""Measuring a conversion of a checkpoint larger than memory, and its report
(experiments/benchmarks/large_checkpoint.py): the page cache of the input dropped
or filled before a step, bytes on disk and rates, and the markdown of the
benchmark's record.
"""

import os

from moejax.evaluation.stats import markdown_table


def tree_bytes(directory: str) -> int:
  """Bytes of every file under directory."""
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(directory) for f in fs)


def drop_cache(directory: str) -> None:
  """sync, then drop the page cache of the directory's files (only those)."""
  os.sync()
  for d, _, files in os.walk(directory):
    for f in files:
      fd = os.open(os.path.join(d, f), os.O_RDONLY)
      os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
      os.close(fd)


def warm_cache(directory: str) -> None:
  """Read every file under directory into the page cache."""
  for d, _, files in os.walk(directory):
    for f in files:
      with open(os.path.join(d, f), "rb") as fh:
        while fh.read(64 << 20):
          pass


def gbps(num_bytes: int, seconds: float) -> float:
  return num_bytes / seconds / 1e9


def conversion_report(r: dict) -> str:
  """The markdown of large_checkpoint's record: the checkpoint, one table row per
  measured step (kind, cache state), and the bit checks."""
  c, m = r["checkpoint"], r["model"]
  runs = {(x["kind"], x["cache"]): x for x in r["runs"]}
  lines = [
    "# Converting a checkpoint larger than its memory budget (CPU)",
    "",
    f"Date: {r['date']}. Machine: {r['machine']['cpu']}, {r['machine']['cores']} cores "
    f"(shared), {r['machine']['memory_gb']} GB RAM.",
    "",
    f"Command: `{r['command']}`",
    "",
    f"Checkpoint: synthetic Qwen3-MoE (`Qwen3MoeForCausalLM`), bf16, {m['num_hidden_layers']} "
    f"layers, hidden {m['hidden_size']}, {m['num_attention_heads']}/{m['num_key_value_heads']} "
    f"heads of {m['head_dim']}, {m['num_experts']} experts of width "
    f"{m['moe_intermediate_size']} (top-{m['num_experts_per_tok']}), vocab {m['vocab_size']}: "
    f"{c['num_tensors']} tensors, {c['bytes'] / 1e9:.2f} GB of tensors in {c['files'] - 2} "
    f"shards ({c['bytes_on_disk'] / 1e9:.2f} GB on disk), written in {c['seconds']:.0f} s.",
    "",
    "GB/s: checkpoint bytes / seconds; `wall` is the child process's whole life "
    "(interpreter and imports included, see `floor`), `conv` the conversion call alone; "
    "x copy = conv GB/s / copy GB/s in the same cache state. Peak RSS: the child's "
    f"maximum resident set ({r['runs'][0]['peak_rss_source']}); anon/file: peaks of "
    "RssAnon/RssFile polled every 20 ms. Load: 1-min load average at the end of the step.",
    "",
  ]
  rows = []
  for (kind, cache), x in runs.items():
    copy = runs.get(("copy", cache))

    def f(k, fmt, x=x):
      return format(x[k], fmt) if x.get(k) is not None else "-"

    rate = x.get("convert_gbps", x.get("gbps")) if kind != "floor" else None
    rows.append(
      [
        kind,
        cache if kind != "floor" else "-",
        f("seconds", ".1f"),
        f("gbps", ".3f"),
        f("convert_seconds", ".1f"),
        f("convert_gbps", ".3f"),
        f"{rate / copy['gbps']:.2f}" if copy and rate else "-",
        f("peak_rss_mb", ".0f"),
        f("peak_anon_mb_polled", ".0f"),
        f("peak_file_mb_polled", ".0f"),
        f("load_average", ".1f"),
      ]
    )
  lines.append(
    markdown_table(
      [
        "step",
        "cache",
        "wall s",
        "wall GB/s",
        "conv s",
        "conv GB/s",
        "x copy",
        "peak RSS MB",
        "peak anon MB",
        "peak file MB",
        "load",
      ],
      rows,
    )
  )
  rt, ws = r["round_trip"], r["workdir_sample"]
  lines += [
    "",
    f"Round trip (import -> export --dtype=bfloat16): {rt['tensors']} tensors, "
    f"bf16 bits {'identical' if rt['identical'] else 'DIFFER: ' + str(rt['differing'])}. "
    f"Sample of {ws['sampled']} source tensors against the converted workdir: "
    f"{'all identical' if ws['identical'] else 'DIFFER'}.",
  ]
  if "orbax_sample" in r:
    o = r["orbax_sample"]
    lines += [
      "",
      f"Sharded orbax import (`orbax`: mesh {r['orbax_mesh']} of 8 simulated CPU "
      f"devices, partial saves of <= 128 MB of arrays, "
      f"{r['orbax_bytes'] / 1e9:.2f} GB written): "
      f"sample of {o['sampled']} source tensors against the restored leaves: "
      f"{'all identical' if o['identical'] else 'DIFFER'}.",
    ]
  return "\n".join(lines)
