r"""Where a decode step's time goes, moejax against transformers (issue 17, part 1):
`python -m experiments.benchmarks.generate --profile` (see that module's doc for
the parts and how each is measured; this module holds the measuring code, which
generate_prefill_profile.py shares for --profile_phase=prefill).
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
import time

import numpy as np

PARTS = ("attention", "moe_router", "moe_dispatch", "moe_experts", "moe_bookkeeping",
         "dense_ffn", "norms", "embedding", "lm_head", "sampling", "other_in_step")


def blocked_times(fn, calls: int) -> list:
  """Wall seconds of fn() with its result waited for, one call at a time."""
  import jax
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


@contextlib.contextmanager
def named_scopes():
  """jax.named_scope around the decoder modules' calls, so that each HLO op's
  op_name says which module made it. Only metadata changes: the compiled ops are
  the same (the step's time is measured on the unpatched generator too)."""
  import jax
  import moejax.inference.generate as gen
  from moejax.layers import attention, dense, moe
  targets = [(attention.GroupedQueryAttention, "__call__", "attention"),
             (attention.LatentAttention, "__call__", "attention"),
             (moe.MoELayer, "__call__", "moe"), (moe.MoELayer, "router_logits", "router"),
             (moe.MoELayer, "dispatch", "dispatch"), (dense.RMSNorm, "__call__", "norm"),
             (dense.Linear, "__call__", "linear"), (dense.SwiGLU, "__call__", "dense_ffn"),
             (gen, "sample_tokens", "sampling")]
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


PARAM_PARTS = {"___attn_": "attention", "___head__": "lm_head", "_router": "moe_router",
               "_experts_": "moe_experts", "_shared_": "moe_experts", "norm____scale": "norms",
               "___embed__": "embedding"}


def hlo_parts(hlo_text: str) -> tuple[dict, dict]:
  """From the compiled HLO text: ({entry instruction: part}, {instruction inside the
  MoE expert loop's body: kind}). A part comes from the op_name's scopes and the
  innermost source frame (file, function, line); an instruction XLA made without
  metadata takes its consumer's part (else its operand's)."""
  tables, section = {}, None
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
  locations = {k: tuple(int(re.search(f"{f}=(\\d+)", v)[1]) for f in
                        ("file_name_id", "function_name_id", "line"))
               for k, v in tables.get("FileLocations", {}).items()}
  frames = {k: int(re.search(r"file_location_id=(\d+)", v)[1])
            for k, v in tables.get("StackFrames", {}).items()}

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
      entry[name] = None if info is None else classify(
          set(info[0].split("/")), info[1], info[2], info[3], name)
      body = re.sub(r"\b(calls|to_apply|body|condition)=%\S+", "", rest.split("metadata=")[0])
      operands[name] = re.findall(r"%([\w.-]+)", body)
    elif info is not None and "moe/dispatch/while" in info[0] and expert_pass(
        info[1], info[2]):
      op = info[0].rsplit("/", 1)[-1]
      if "dot" in name or "ynn" in name or op == "dot_general":
        loop_body[name] = "matmuls"
      elif "[expert]" in info[3]:  # w_gate[expert]: the expert's weights sliced out
        loop_body[name] = "expert weight slices"
      elif any(k in name or k in op for k in ("gather", "scatter", "dynamic-slice",
                                              "dynamic_slice", "dynamic-update-slice")):
        loop_body[name] = "row gather, scatter-add, slices"
      else:
        loop_body[name] = "elementwise, loop conditions"
  users = {}
  for name, args in operands.items():
    for arg in args:
      if arg in entry:
        users.setdefault(arg, []).append(name)
  for n in [n for n, part in entry.items() if part is None]:  # a weight names its module
    weights = [PARAM_PARTS[k] for a in operands[n] if a.startswith("params_")
               for k in PARAM_PARTS if k in a]
    entry[n] = weights[0] if weights else None
  for _ in range(len(entry)):  # metadata-less ones: the consumer's part, else the operand's
    unknown = [n for n, part in entry.items() if part is None]
    if not unknown:
      break
    for n in unknown:
      near = [entry[u] for u in users.get(n, []) if entry[u]] or [
          entry[a] for a in operands.get(n, []) if a in entry and entry[a]]
      entry[n] = near[0] if near else None
  return {n: part or "other_in_step" for n, part in entry.items()}, loop_body


def expert_pass(file: str, function: str) -> bool:
  """An op of the expert pass proper (the block loop and its matmuls), not of the layout."""
  return ("/experts/" in file or "/kernels/" in file or "for_each_block" in function
          or function.endswith("body") or "matmul" in function)


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
  for folder, part in (("/routing/", "moe_router"), ("/dispatch/", "moe_dispatch"),
                       ("/experts/", "moe_experts"), ("/losses/", "moe_bookkeeping"),
                       ("/layers/moe.py", "moe_bookkeeping"), ("/layers/attention.py",
                       "attention"), ("/layers/rope.py", "attention")):
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
  by_part, by_kind, count = dict.fromkeys(PARTS, 0.0), {}, 0
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
  durations, top = {}, []
  for event in events:
    if event["name"] in parts or event["name"] in loop_body:
      durations.setdefault(event["name"], []).append(event["dur"])
    if event["name"] in parts:
      top.append((event["ts"], event["ts"] + event["dur"]))
  top.sort()  # the calls ran one after another, each the same entry thunks
  per_call = len(top) // calls
  spans = [max(end for _, end in group) - group[0][0]
           for group in (top[i * per_call:(i + 1) * per_call] for i in range(calls))]
  for name, times in durations.items():  # median per thunk: robust to a preempted one
    per_run = float(np.median(times)) * len(times) / calls
    if name in parts:
      by_part[parts[name]] += per_run
      count += len(times)
    else:
      by_kind[loop_body[name]] = by_kind.get(loop_body[name], 0.0) + per_run
  return by_part, by_kind, count / calls, float(np.median(spans)) if spans else 0.0


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


def scoped_profile(fn, args: tuple, static_argnums: tuple, calls: int):
  """profile() -> one profiled run of `calls` calls of fn(*args), compiled again under
  named_scopes (the same ops, named): its XLA thunks by part, their span, and
  cost_analysis. fn must be a new function (jax's trace cache holds unscoped ones)."""
  import jax
  with named_scopes():
    compiled = jax.jit(fn, static_argnums=static_argnums).lower(*args).compile()
  parts, loop_body = hlo_parts(compiled.as_text())
  cost = compiled.cost_analysis() or {}
  dynamic = [a for i, a in enumerate(args) if i not in static_argnums]

  def profile():
    thunks, loop_kinds, count, span = trace_thunks(
        lambda: compiled(*dynamic), calls, parts, loop_body)
    return {"thunk_us": thunks, "expert_loop_us": loop_kinds, "thunks_per_step": count,
            "span_us": span,
            "hlo_instructions_by_part": {p: sum(v == p for v in parts.values()) for p in PARTS},
            "flops": float(cost.get("flops", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0))}
  return profile


HF_PART = {"embed_tokens": "embedding", "rotary_emb": "attention", "self_attn": "attention",
           "input_layernorm": "norms", "post_attention_layernorm": "norms", "norm": "norms",
           "gate": "moe_router", "experts": "moe_experts", "shared_experts": "moe_experts",
           "lm_head": "lm_head"}


def hf_hooks(hf_model, totals: dict) -> list:
  """Forward hooks adding each module's inclusive wall time to totals[part]; a
  MoE block's own time (outside gate and experts) goes to moe_dispatch, a dense
  MLP's to dense_ffn."""
  starts, handles = {}, []

  def part_of(name, module):
    path = name.split(".")
    if "mlp" in path[:-1]:  # inside an MLP: a MoE block's router and experts only
      return HF_PART[path[-1]] if path[-2] == "mlp" and path[-1] in (
          "gate", "experts", "shared_experts") else None
    if path[-1] == "mlp":
      return "mlp_moe" if hasattr(module, "gate") else "dense_ffn"
    return None if "self_attn" in path[:-1] else HF_PART.get(path[-1])

  for name, module in hf_model.named_modules():
    part = part_of(name, module)
    if part is None:
      continue

    def pre(module, args, _key=name):
      starts[_key] = time.perf_counter()

    def post(module, args, output, _key=name, _part=part):
      totals[_part] = totals.get(_part, 0.0) + time.perf_counter() - starts[_key]
    handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
  return handles


def transformers_run(hf_model, prompts, new_tokens: int):
  """run(hooked) -> a dict, from inside transformers' own generate: a hook on the top
  module times each forward. 'forwards' the decode forwards' seconds (the first, the
  prefill, left out), 'gaps' the host work between two (generate's loop: logits
  processors, argmax, stopping criteria, cache and input bookkeeping), 'parts'
  {part: seconds per decode forward}; 'prefill' the first forward's seconds,
  'prefill_parts' its {part: seconds}.
  hooked=True adds hooks on every part's module."""
  import torch

  def run(hooked: bool):
    totals, spans, prefill_parts = {}, [], {}
    handles = hf_hooks(hf_model, totals) if hooked else []

    def pre(module, args, kwargs):
      spans.append([time.perf_counter(), None])

    def post(module, args, kwargs, output):
      spans[-1][1] = time.perf_counter()
      if len(spans) == 1:  # the prefill
        prefill_parts.update(totals)
        totals.clear()
    handles += [hf_model.register_forward_pre_hook(pre, with_kwargs=True),
                hf_model.register_forward_hook(post, with_kwargs=True)]
    try:
      with torch.no_grad():
        ids = torch.as_tensor(prompts)
        hf_model.generate(ids, do_sample=False, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, attention_mask=torch.ones_like(ids),
                          pad_token_id=0)
    finally:
      for handle in handles:
        handle.remove()
    forwards = [end - begin for begin, end in spans[1:]]
    return {"forwards": forwards, "gaps": [b[0] - a[1] for a, b in zip(spans, spans[1:])],
            "parts": {k: v / max(len(forwards), 1) for k, v in totals.items()},
            "prefill": spans[0][1] - spans[0][0], "prefill_parts": prefill_parts}
  return run


def hf_parts(parts: dict, forward: float) -> dict:
  """Hooked inclusive times -> PARTS (a MoE block's own time is its dispatch glue;
  what no hooked module holds is other_in_step)."""
  by_part = dict.fromkeys(PARTS, 0.0)
  for name, seconds in parts.items():
    if name != "mlp_moe":
      by_part[name] += seconds
  inner = sum(parts.get(k, 0.0) for k in ("moe_router", "moe_experts"))
  by_part["moe_dispatch"] = max(parts.get("mlp_moe", 0.0) - inner, 0.0)
  by_part["other_in_step"] = max(forward - sum(by_part.values()), 0.0)
  return by_part


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


def median_profile(profiles: list) -> dict:
  """The median of the rounds' scoped profiles, key by key (the first's other keys)."""
  return {**profiles[0], **{
      key: {k: float(np.median([p[key].get(k, 0.0) for p in profiles]))
            for k in profiles[0][key]} for key in ("thunk_us", "expert_loop_us")},
      "span_us": float(np.median([p["span_us"] for p in profiles]))}


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
    row["ours_expert_loop_s"]["(the while thunks' own events, which ended before their "
                              "bodies ran: not in the expert part)"] = top
    return
  row["ours_expert_loop_s"]["while-loop runtime between these thunks (the rest)"
                            if inside > 0 else "no loop ('gather' path): all of it"] = top - inside


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


LABELS = {"attention": "attention (qkv, RoPE, cache write, scores, out)",
          "moe_router": "MoE router (logits, top-k)",
          "moe_dispatch": "MoE dispatch (sort, layout / transformers: block glue)",
          "moe_experts": "MoE experts (moejax: 'gather' when B*k <= E, else the block loop: "
                         "gather, matmuls, scatter; transformers: per-expert loop; + shared)",
          "moe_bookkeeping": "MoE bookkeeping (router losses, load metrics)",
          "dense_ffn": "dense FFN", "norms": "RMSNorms", "embedding": "embedding",
          "lm_head": "LM head", "sampling": "sampling (moejax: in the step)",
          "other_in_step": "other in the step or prefill (residuals, masks, positions; "
                           "moejax: cache bookkeeping copies)"}


def part_lines(r, what: str):
  """The table's head and one line per part; line(label, ours, theirs) adds more."""
  ours_total, theirs_total = r["ours_loop_s"], r["theirs_loop_s"]
  lines = [f"#### {r['family']}, batch {r['batch']}: ms per {what}", "",
           "| part | moejax ms | share | transformers ms | share | transformers / moejax |",
           "|---|---|---|---|---|---|"]

  def line(label, a, b):
    ratio = f"{b / a:.1f}" if a > 1e-7 and b > 1e-7 else "-"
    lines.append(f"| {label} | {a * 1e3:.3f} | {a / ours_total:.0%} | {b * 1e3:.3f} | "
                 f"{b / theirs_total:.0%} | {ratio} |")
  for part in PARTS:
    a, b = r["ours_parts_s"][part], r["theirs_parts_s"][part]
    if a > 0 or b > 0:
      line(LABELS[part], a, b)
  moe = ("moe_router", "moe_dispatch", "moe_experts", "moe_bookkeeping")
  line("XLA:CPU runtime between the program's thunks (moejax)", r["ours_between_thunks_s"], 0.0)
  line("**MoE layers, all of it**", sum(r["ours_parts_s"][p] for p in moe),
       sum(r["theirs_parts_s"][p] for p in moe))
  return lines, line


def expert_loop_lines(r) -> list:
  lines = ["", "| moejax's MoE expert part, by its loops' inner thunks | ms | share |",
           "|---|---|---|"]
  for kind, seconds in sorted(r["ours_expert_loop_s"].items(), key=lambda kv: -kv[1]):
    lines.append(f"| {kind} | {seconds * 1e3:.3f} | {seconds / r['ours_loop_s']:.0%} |")
  return lines


def profile_table(rows) -> str:
  lines = []
  for r in rows:
    o, med = r["ours_profile"], r["timings_s"]
    ours_total, theirs_total = r["ours_loop_s"], r["theirs_loop_s"]
    more, line = part_lines(r, "decode step (one token per row)")
    lines += more
    line("**(a) the step** (moejax: the compiled step's thunks, first start to last end; "
         "transformers: the model's forward in generate)", r["ours_device_s"],
         r["theirs_forward_s"])
    line("**(b) host, outside the step** (moejax: per-token time of generate - (a), "
         "negative where DECODE_CHUNK steps per call save more than the host costs; "
         "transformers: generate's work between two forwards)", r["ours_host_s"],
         r["theirs_host_s"])
    line("**per decode step in generate** (moejax: generate(N) - generate(1), per token; "
         "transformers: forward + host)", ours_total, theirs_total)
    lines += expert_loop_lines(r)
    lines += ["", f"Load average {', '.join(f'{v:.1f}' for v in r['loadavg'])}. moejax: the "
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
              f"{r['read_bytes_per_s'] / 1e9:.0f} GB/s one core reads here.", ""]
  return "\n".join(lines)
