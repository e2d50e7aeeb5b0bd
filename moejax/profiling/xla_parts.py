"""Where a compiled moejax program's time goes: named scopes around the decoder
modules' calls, each compiled HLO instruction attributed to a part (attention, MoE
router, dispatch, experts, ...) by its scopes and source frame, and the XLA:CPU
thunks of a profiled run summed by part (`scoped_profile`).
"""

import contextlib
import functools
import glob
import gzip
import json
import linecache
import os
import re
import tempfile

import numpy as np

PARTS = (
  "attention",
  "moe_router",
  "moe_dispatch",
  "moe_experts",
  "moe_bookkeeping",
  "dense_ffn",
  "norms",
  "embedding",
  "lm_head",
  "sampling",
  "other_in_step",
)


@contextlib.contextmanager
def named_scopes():
  """jax.named_scope around the decoder modules' calls, so that each HLO op's
  op_name says which module made it. Only metadata changes: the compiled ops are
  the same (the step's time is measured on the unpatched generator too)."""
  import jax
  import moejax.inference.generate as gen
  from moejax.layers import attention, dense, moe

  targets = [
    (attention.GroupedQueryAttention, "__call__", "attention"),
    (attention.LatentAttention, "__call__", "attention"),
    (moe.MoELayer, "__call__", "moe"),
    (moe.MoELayer, "router_logits", "router"),
    (moe.MoELayer, "dispatch", "dispatch"),
    (dense.RMSNorm, "__call__", "norm"),
    (dense.Linear, "__call__", "linear"),
    (dense.SwiGLU, "__call__", "dense_ffn"),
    (gen, "sample_tokens", "sampling"),
  ]
  saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
  for owner, name, scope in targets:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args, _original=original, _scope=scope, **kwargs):
      with jax.named_scope(_scope):
        return _original(*args, **kwargs)

    setattr(owner, name, wrapped)
  try:
    yield
  finally:
    for owner, name, original in saved:
      setattr(owner, name, original)


PARAM_PARTS = {
  "___attn_": "attention",
  "___head__": "lm_head",
  "_router": "moe_router",
  "_experts_": "moe_experts",
  "_shared_": "moe_experts",
  "norm____scale": "norms",
  "___embed__": "embedding",
}


def _int_field(pattern: str, text: str) -> int:
  """The integer group 1 of `pattern` in the HLO line `text`; ValueError where it lacks it."""
  match = re.search(pattern, text)
  if match is None:
    raise ValueError(f"no {pattern!r} in the HLO line {text!r}")
  return int(match[1])


def hlo_parts(hlo_text: str) -> tuple[dict, dict]:
  """From the compiled HLO text: ({entry instruction: part}, {instruction inside the
  MoE expert loop's body: kind}). A part comes from the op_name's scopes and the
  innermost source frame (file, function, line); an instruction XLA made without
  metadata takes its consumer's part (else its operand's)."""
  tables: dict[str, dict[int, str]] = {}
  section: dict[int, str] | None = None
  for line in hlo_text.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = tables.setdefault(line, {})
    elif section is not None and re.match(r"^\d+ ", line):
      key, value = line.split(" ", 1)
      section[int(key)] = value
    elif not line.strip():
      section = None
  files = {k: v.strip('"') for k, v in tables.get("FileNames", {}).items()}
  functions = {k: v.strip('"') for k, v in tables.get("FunctionNames", {}).items()}
  locations = {
    k: tuple(_int_field(f"{f}=(\\d+)", v) for f in ("file_name_id", "function_name_id", "line"))
    for k, v in tables.get("FileLocations", {}).items()
  }
  frames = {
    k: _int_field(r"file_location_id=(\d+)", v) for k, v in tables.get("StackFrames", {}).items()
  }

  def source_of(line):
    meta = re.search(r'op_name="([^"]*)"(?: stack_frame_id=(\d+))?', line)
    if not meta:
      return None
    file = function = source = ""
    if meta[2] and int(meta[2]) in frames:
      file_id, function_id, lineno = locations[frames[int(meta[2])]]
      file, function = files.get(file_id, ""), functions.get(function_id, "")
      source = linecache.getline(file, lineno)
    return meta[1], file, function, source

  entry, loop_body, in_entry = {}, {}, False
  operands = {}
  for line in hlo_text.splitlines():
    if line.startswith("ENTRY "):
      in_entry = True
      continue
    m = re.match(r"\s*(?:ROOT )?%(\S+) = (.*)", line)
    if not m:
      in_entry = in_entry and line != "}"
      continue
    name, rest = m[1], m[2]
    info = source_of(line)
    if in_entry:
      entry[name] = (
        None if info is None else classify(set(info[0].split("/")), info[1], info[2], info[3], name)
      )
      body = re.sub(r"\b(calls|to_apply|body|condition)=%\S+", "", rest.split("metadata=")[0])
      operands[name] = re.findall(r"%([\w.-]+)", body)
    elif info is not None and "moe/dispatch/while" in info[0] and expert_pass(info[1], info[2]):
      op = info[0].rsplit("/", 1)[-1]
      if "dot" in name or "ynn" in name or op == "dot_general":
        loop_body[name] = "matmuls"
      elif "[expert]" in info[3]:  # w_gate[expert]: the expert's weights sliced out
        loop_body[name] = "expert weight slices"
      elif any(
        k in name or k in op
        for k in ("gather", "scatter", "dynamic-slice", "dynamic_slice", "dynamic-update-slice")
      ):
        loop_body[name] = "row gather, scatter-add, slices"
      else:
        loop_body[name] = "elementwise, loop conditions"
  users: dict[str, list[str]] = {}
  for name, args in operands.items():
    for arg in args:
      if arg in entry:
        users.setdefault(arg, []).append(name)
  for n in [n for n, part in entry.items() if part is None]:  # a weight names its module
    weights = [
      PARAM_PARTS[k] for a in operands[n] if a.startswith("params_") for k in PARAM_PARTS if k in a
    ]
    entry[n] = weights[0] if weights else None
  for _ in range(len(entry)):  # metadata-less ones: the consumer's part, else the operand's
    unknown = [n for n, part in entry.items() if part is None]
    if not unknown:
      break
    for n in unknown:
      near = [entry[u] for u in users.get(n, []) if entry[u]] or [
        entry[a] for a in operands.get(n, []) if a in entry and entry[a]
      ]
      entry[n] = near[0] if near else None
  return {n: part or "other_in_step" for n, part in entry.items()}, loop_body


def expert_pass(file: str, function: str) -> bool:
  """An op of the expert pass proper (the block loop and its matmuls), not of the layout."""
  return (
    "/experts/" in file
    or "/kernels/" in file
    or "for_each_block" in function
    or function.endswith("body")
    or "matmul" in function
  )


def classify(scopes: set, file: str, function: str, source: str, name: str) -> str:
  if "sampling" in scopes:
    return "sampling"
  if "attention" in scopes:
    return "attention"
  if "moe" in scopes:
    if "router" in scopes or "/routing/" in file:
      return "moe_router"
    if "dispatch" in scopes:  # the expert pass vs the layout (sort, offsets, schedule)
      return "moe_experts" if expert_pass(file, function) else "moe_dispatch"
    if "dense_ffn" in scopes:  # shared experts
      return "moe_experts"
    return "moe_bookkeeping"  # router losses, load metrics, distinct experts
  if "dense_ffn" in scopes:
    return "dense_ffn"
  if "norm" in scopes:
    return "norms"
  if "linear" in scopes or "self.embed[...].T" in source:
    return "lm_head"
  if "table[" in source or "self.embed[...].astype" in source:
    return "embedding"
  # ops that lost their scope (XLA's own, e.g. a cumsum's reduce_window): by file
  for folder, part in (
    ("/routing/", "moe_router"),
    ("/dispatch/", "moe_dispatch"),
    ("/experts/", "moe_experts"),
    ("/losses/", "moe_bookkeeping"),
    ("/layers/moe.py", "moe_bookkeeping"),
    ("/layers/attention.py", "attention"),
    ("/layers/rope.py", "attention"),
  ):
    if folder in file:
      return part
  return "other_in_step"


def trace_thunks(fn, calls: int, parts: dict, loop_body: dict):
  """fn() run `calls` times under jax.profiler (Python tracer off); XLA:CPU records
  each executed thunk under its HLO instruction's name. Returns microseconds per
  call (each thunk's median duration times its runs per call) by part (thunks of
  the entry computation: a while loop's holds its body's), the same inside the MoE
  expert loops by kind (their bodies' thunks), thunks of the entry computation per
  call, and the median span of a call's thunks (first start to last end: the
  executable's time, without the host before or after it)."""
  import jax

  by_part, count = dict.fromkeys(PARTS, 0.0), 0
  by_kind: dict[str, float] = {}
  options = jax.profiler.ProfileOptions()
  options.python_tracer_level = 0
  with tempfile.TemporaryDirectory() as directory:
    jax.block_until_ready(fn())
    with jax.profiler.trace(directory, create_perfetto_trace=True, profiler_options=options):
      for _ in range(calls):
        jax.block_until_ready(fn())
    (path,) = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(path) as f:
      events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
  durations: dict[str, list[float]] = {}
  top = []
  for event in events:
    if event["name"] in parts or event["name"] in loop_body:
      durations.setdefault(event["name"], []).append(event["dur"])
    if event["name"] in parts:
      top.append((event["ts"], event["ts"] + event["dur"]))
  top.sort()  # the calls ran one after another, each the same entry thunks
  per_call = len(top) // calls
  spans = [
    max(end for _, end in group) - group[0][0]
    for group in (top[i * per_call : (i + 1) * per_call] for i in range(calls))
  ]
  for name, times in durations.items():  # median per thunk: robust to a preempted one
    per_run = float(np.median(times)) * len(times) / calls
    if name in parts:
      by_part[parts[name]] += per_run
      count += len(times)
    else:
      by_kind[loop_body[name]] = by_kind.get(loop_body[name], 0.0) + per_run
  return by_part, by_kind, count / calls, float(np.median(spans)) if spans else 0.0


def scoped_profile(fn, args: tuple, static_argnums: tuple, calls: int):
  """profile() -> one profiled run of `calls` calls of fn(*args), compiled again under
  named_scopes (the same ops, named): its XLA thunks by part, their span, and
  cost_analysis. fn must be a new function (jax's trace cache holds unscoped ones)."""
  import jax

  with named_scopes():
    compiled = jax.jit(fn, static_argnums=static_argnums).lower(*args).compile()
  hlo_text = compiled.as_text()
  if hlo_text is None:
    raise ValueError("the compiled program gives no HLO text")
  parts, loop_body = hlo_parts(hlo_text)
  cost = compiled.cost_analysis() or {}
  dynamic = [a for i, a in enumerate(args) if i not in static_argnums]

  def profile():
    thunks, loop_kinds, count, span = trace_thunks(
      lambda: compiled(*dynamic), calls, parts, loop_body
    )
    return {
      "thunk_us": thunks,
      "expert_loop_us": loop_kinds,
      "thunks_per_step": count,
      "span_us": span,
      "hlo_instructions_by_part": {p: sum(v == p for v in parts.values()) for p in PARTS},
      "flops": float(cost.get("flops", 0.0)),
      "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
    }

  return profile


def median_profile(profiles: list) -> dict:
  """The median of the rounds' scoped profiles, key by key (the first's other keys)."""
  return {
    **profiles[0],
    **{
      key: {k: float(np.median([p[key].get(k, 0.0) for p in profiles])) for k in profiles[0][key]}
      for key in ("thunk_us", "expert_loop_us")
    },
    "span_us": float(np.median([p["span_us"] for p in profiles])),
  }


def add_loop_rest(row: dict) -> None:
  """The MoE expert part's time outside its loops' inner thunks, as its own kind.

  Where the inner thunks add up to more than the expert part's top-level thunks,
  XLA:CPU ran the loop bodies on its thread pool after their while thunks' own
  events had ended (seen at prefill with a few hundred rows: top-level thunks on
  three threads); their time then sat in the runtime between thunks. The expert
  part becomes the inner thunks' sum (what its bodies ran, at least), and the
  runtime between thunks loses as much."""
  inside = sum(row["ours_expert_loop_s"].values())
  top = row["ours_parts_s"]["moe_experts"]
  if inside > top:
    row["ours_parts_s"]["moe_experts"] = inside
    row["ours_between_thunks_s"] -= inside - top
    row["ours_expert_loop_s"][
      "(the while thunks' own events, which ended before their bodies ran: not in the expert part)"
    ] = top
    return
  row["ours_expert_loop_s"][
    "while-loop runtime between these thunks (the rest)"
    if inside > 0
    else "no loop ('gather' path): all of it"
  ] = top - inside
