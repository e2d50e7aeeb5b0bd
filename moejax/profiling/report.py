"""The markdown of the benchmarks: the generation benchmark's
(experiments/benchmarks/generate.py) speed table, and of its profile (--profile): per
family and batch, each part's milliseconds and share, moejax against transformers, the
MoE expert part by its loops' inner thunks, and the prefill's time to first token; the
MoE layer benchmark's (experiments/benchmarks/moe_layer.py) per-shape path tables.
"""

import datetime
import os

import jax

from moejax.evaluation.stats import markdown_table
from moejax.profiling.timing import cpu_model
from moejax.profiling.xla_parts import PARTS

LABELS = {
  "attention": "attention (qkv, RoPE, cache write, scores, out)",
  "moe_router": "MoE router (logits, top-k)",
  "moe_dispatch": "MoE dispatch (sort, layout / transformers: block glue)",
  "moe_experts": "MoE experts (moejax: 'gather' when B*k <= E, else the block loop: "
  "gather, matmuls, scatter; transformers: per-expert loop; + shared)",
  "moe_bookkeeping": "MoE bookkeeping (router losses, load metrics)",
  "dense_ffn": "dense FFN",
  "norms": "RMSNorms",
  "embedding": "embedding",
  "lm_head": "LM head",
  "sampling": "sampling (moejax: in the step)",
  "other_in_step": "other in the step or prefill (residuals, masks, positions; "
  "moejax: cache bookkeeping copies)",
}


def part_rows(r):
  """One row per part that took time, then the runtime between moejax's thunks and
  the MoE layers in all; row(label, ours, theirs) (seconds) adds more rows."""
  rows = []

  def row(label, a, b):
    ratio = f"{b / a:.1f}" if a > 1e-7 and b > 1e-7 else "-"
    rows.append(
      [
        label,
        f"{a * 1e3:.3f}",
        f"{a / r['ours_loop_s']:.0%}",
        f"{b * 1e3:.3f}",
        f"{b / r['theirs_loop_s']:.0%}",
        ratio,
      ]
    )

  for part in PARTS:
    a, b = r["ours_parts_s"][part], r["theirs_parts_s"][part]
    if a > 0 or b > 0:
      row(LABELS[part], a, b)
  moe = ("moe_router", "moe_dispatch", "moe_experts", "moe_bookkeeping")
  row("XLA:CPU runtime between the program's thunks (moejax)", r["ours_between_thunks_s"], 0.0)
  row(
    "**MoE layers, all of it**",
    sum(r["ours_parts_s"][p] for p in moe),
    sum(r["theirs_parts_s"][p] for p in moe),
  )
  return rows, row


def parts_table(r, what: str, rows) -> list:
  """The heading and the table of part_rows' rows, as lines."""
  return [
    f"#### {r['family']}, batch {r['batch']}: ms per {what}",
    "",
    markdown_table(
      ["part", "moejax ms", "share", "transformers ms", "share", "transformers / moejax"], rows
    ),
  ]


def expert_loop_lines(r) -> list:
  """moejax's MoE expert part by its loops' inner thunks, largest first, as lines."""
  return [
    "",
    markdown_table(
      ["moejax's MoE expert part, by its loops' inner thunks", "ms", "share"],
      [
        [kind, f"{seconds * 1e3:.3f}", f"{seconds / r['ours_loop_s']:.0%}"]
        for kind, seconds in sorted(r["ours_expert_loop_s"].items(), key=lambda kv: -kv[1])
      ],
    ),
  ]


def profile_table(rows) -> str:
  """Per profiled row (family, batch): the parts of a decode step, the expert loops and
  the step's other timings."""
  lines = []
  for r in rows:
    o, med = r["ours_profile"], r["timings_s"]
    ours_total, theirs_total = r["ours_loop_s"], r["theirs_loop_s"]
    rows_, line = part_rows(r)
    line(
      "**(a) the step** (moejax: the compiled step's thunks, first start to last end; "
      "transformers: the model's forward in generate)",
      r["ours_device_s"],
      r["theirs_forward_s"],
    )
    line(
      "**(b) host, outside the step** (moejax: per-token time of generate - (a), "
      "negative where DECODE_CHUNK steps per call save more than the host costs; "
      "transformers: generate's work between two forwards)",
      r["ours_host_s"],
      r["theirs_host_s"],
    )
    line(
      "**per decode step in generate** (moejax: generate(N) - generate(1), per token; "
      "transformers: forward + host)",
      ours_total,
      theirs_total,
    )
    lines += parts_table(r, "decode step (one token per row)", rows_)
    lines += expert_loop_lines(r)
    lines += [
      "",
      f"Load average {', '.join(f'{v:.1f}' for v in r['loadavg'])}. moejax: the "
      f"jitted step called alone and waited for {med['step'] * 1e3:.3f} ms, a call of "
      f"the same signature doing no work {med['dispatch'] * 1e3:.3f} ms, fold_in "
      f"{med['fold_in'] * 1e3:.3f} ms, {med['fused'] * 1e3:.3f} ms per step with "
      f"the steps fused in one call (fori_loop: no host between steps); "
      f"{o['thunks_per_step']:.0f} XLA thunks per step (top level); XLA cost_analysis "
      f"{o['flops'] / 1e6:.0f} MFLOP, {o['bytes_accessed'] / 2**20:.1f} MiB (each while "
      f"body counted once, whatever its trip count). transformers: forward with hooks "
      f"{r['theirs_forward_hooked_s'] * 1e3:.3f} ms vs {r['theirs_forward_s'] * 1e3:.3f}"
      f" ms without (shares scaled to the latter); per token from whole generate calls "
      f"(as the speed table) {r['theirs_generate_loop_s'] * 1e3:.3f} ms. Weights one "
      f"step reads ({', '.join(f'{d:.1f}' for d in r['distinct_experts_per_layer'])} "
      f"experts per MoE layer): {r['weight_bytes_per_step'] / 2**20:.1f} MiB, "
      f"{r['weight_bytes_per_step'] / r['read_bytes_per_s'] * 1e3:.3f} ms at the "
      f"{r['read_bytes_per_s'] / 1e9:.0f} GB/s one core reads here.",
      "",
    ]
  return "\n".join(lines)


def prefill_lines(r) -> list:
  rows, line = part_rows(r)
  line(
    "**(a) the prefill** (moejax: the compiled prefill's thunks, first start to last end; "
    "transformers: the model's first forward in generate)",
    r["ours_device_s"],
    r["theirs_forward_s"],
  )
  line(
    "**(b) host** (time to first token - (a): moejax's padding, bucketing, calls and "
    "read-back; transformers' generate set-up, logits processing)",
    r["ours_host_s"],
    r["theirs_host_s"],
  )
  line(
    "**time to first token** (generate with one new token, median)",
    r["ours_loop_s"],
    r["theirs_loop_s"],
  )
  lines = parts_table(
    r, f"prefill of {r['batch']} x {r['prompt_len']} prompt tokens (time to first token)", rows
  )
  lines += expert_loop_lines(r)
  useful, peak = r["useful_matmul_flops"], r["plain_matmul_flops_per_s"]
  lines += [
    "",
    f"Load average {', '.join(f'{v:.1f}' for v in r['loadavg'])}. Useful matmul "
    f"work (2 x the weights each prompt token multiplies, routed experts at top-k): "
    f"{useful / 1e6:.0f} MFLOP; moejax's prefill runs it at "
    f"{useful / r['ours_device_s'] / 1e9:.1f} GFLOP/s, transformers' forward at "
    f"{useful / r['theirs_forward_s'] / 1e9:.1f}, one plain float32 matmul of the same "
    f"rows ([rows, d_model] @ [d_model, d_ff], jitted) at {peak / 1e9:.1f}. "
    f"moejax's prefill program alone, called and waited for: "
    f"{r['timings_s']['prefill'] * 1e3:.3f} ms; {r['ours_profile']['thunks_per_step']:.0f}"
    f" XLA thunks (top level). transformers' forward with hooks "
    f"{r['theirs_forward_hooked_s'] * 1e3:.3f} ms vs {r['theirs_forward_s'] * 1e3:.3f} ms "
    f"without (shares scaled to the latter).",
    "",
  ]
  return lines


def prefill_table(rows) -> str:
  return "\n".join(line for r in rows for line in prefill_lines(r))


def speed_table(rows) -> str:
  """Per speed row (family, batch): prefill and decode tok/s of both sides and their
  ratio, time to first token, and the fraction of identical tokens; then, for each row
  whose tokens differ, where they first do and both models' logits for both tokens."""
  lines = []
  for r in rows:
    d = r.get("first_divergence")
    if d is None:
      continue
    ours, theirs = d["tokens"]["moejax"], d["tokens"]["transformers"]
    lines.append(
      f"- {r['family']} batch {r['batch']}: first divergence at row {d['row']}, step "
      f"{d['step']}: moejax picks {ours}, transformers {theirs}; logits of ({ours}, {theirs}): "
      f"moejax ({d['moejax_logits']['moejax']:.4f}, {d['moejax_logits']['transformers']:.4f}), "
      f"transformers ({d['transformers_logits']['moejax']:.4f}, "
      f"{d['transformers_logits']['transformers']:.4f})"
    )
  return _speed_rows_table(rows) + ("\n\n" + "\n".join(lines) if lines else "")


def _speed_rows_table(rows) -> str:
  return markdown_table(
    [
      "family",
      "batch",
      "prefill tok/s moejax / transformers (ratio)",
      "decode tok/s moejax / transformers (ratio)",
      "time to first token, s",
      "identical tokens",
    ],
    [
      [
        r["family"],
        r["batch"],
        f"{r['ours_prefill_tok_s']:.0f} / {r['theirs_prefill_tok_s']:.0f} "
        f"({r['prefill_ratio']:.2f}x)",
        f"{r['ours_decode_tok_s']:.0f} / {r['theirs_decode_tok_s']:.0f} ({r['decode_ratio']:.2f}x)",
        f"{r['ours_ttft_s']:.3f} / {r['theirs_ttft_s']:.3f}",
        f"{r['identical']:.3f}",
      ]
      for r in rows
    ],
  )


def moe_layer_tables(
  records, settings: str, reference: str, naive: str, omni_paths, omni_tile: int
) -> str:
  """experiments.benchmarks.moe_layer's tables: a machine line, `settings`, then per shape
  each path's fwd and fwd+bwd time and ratio to dense, fwd+bwd temp memory (also over
  the `reference` path's), padding waste, and `naive` OmniMoE time over each of
  `omni_paths`' (at dropless tile `omni_tile`)."""
  load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
  lines = [
    f"Machine: {cpu_model()}, {os.cpu_count()} cores, jax {jax.__version__}, "
    f"backend {jax.default_backend()}; {datetime.date.today().isoformat()}; "
    f"load average at the end {load} (the machine is shared).",
    settings,
    "",
  ]

  def fmt(r, key, spec):
    if not r:
      return "-"
    if r[key] is None:
      return "skipped"
    if key == "ratio_to_dense" and r["path"] == "routing_layout":  # an overhead, not a path
      return f"{1 / r[key]:.0%} of dense"
    return format(r[key], spec)

  for shape in dict.fromkeys(r["shape"] for r in records):
    by = {(r["path"], r["pass"]): r for r in records if r["shape"] == shape}
    r0 = next(iter(by.values()))
    plain = by.get((reference, "fwd+bwd"))
    rows = []
    for path in dict.fromkeys(p for p, _ in by):
      fwd, bwd = by.get((path, "fwd")), by.get((path, "fwd+bwd"))
      rows.append(
        [
          path,
          fmt(fwd, "time_ms", ".1f"),
          fmt(fwd, "ratio_to_dense", ".2f"),
          fmt(bwd, "time_ms", ".1f"),
          fmt(bwd, "ratio_to_dense", ".2f"),
          f"{bwd['temp_bytes'] / 2**20:.1f}" if bwd else "-",
          f"{bwd['temp_bytes'] / plain['temp_bytes']:.2f}" if bwd and plain else "-",
          fmt(fwd or bwd, "padding_waste", ".3f"),
        ]
      )
    lines += [
      f"### {shape}: T={r0['T']}, d={r0['d']}, f={r0['f']}, E={r0['E']}, k={r0['k']}",
      "",
      markdown_table(
        [
          "path",
          "fwd ms",
          "fwd ratio",
          "fwd+bwd ms",
          "fwd+bwd ratio",
          "fwd+bwd temp MiB",
          f"temp / {reference}",
          "padding waste",
        ],
        rows,
      ),
    ]
    naive_by = {w: r for w in ("fwd", "fwd+bwd") if (r := by.get((naive, w)))}
    for path in (p for p in omni_paths if any((p, w) in by for w in naive_by)):
      ratios = [
        f"{w} {naive_by[w]['time_ms'] / by[path, w]['time_ms']:.2f}"
        for w in naive_by
        if by.get((path, w)) and by[path, w]["time_ms"]
      ]
      lines += [
        "",
        f"{naive} time / {path} time (tile {omni_tile}): " + ", ".join(ratios),
      ]
    lines.append("")
  return "\n".join(lines)
