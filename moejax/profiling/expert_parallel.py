"""The expert-parallel benchmark's layer (experiments/benchmarks/expert_parallel.py):
one MoE layer's fwd+bwd on one device or through moejax.dispatch.expert_parallel on
a mesh of the simulated devices, its all_to_all bytes read from the partitioned HLO,
the interleaved timing and the report's table. The caller sets XLA_FLAGS (device
count) before jax is imported.
"""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from moejax import sharding
from moejax.config import base_config
from moejax.dispatch import get_dispatcher
from moejax.dispatch.capacity import capacity_of
from moejax.dispatch.exchange import rows_per_peer
from moejax.dispatch.expert_parallel import expert_parallel_dispatch
from moejax.evaluation.stats import markdown_table
from moejax.experts import swiglu_experts
from moejax.experts.swiglu import SwiGLUExperts
from moejax.profiling.timing import interleaved_times, medians, with_backward
from moejax.routing import call_router

MESHES = {
  "data2_expert4": dict(data=2, expert=4),
  "expert8": dict(expert=8),
  "fsdp2_expert2_tensor2": dict(fsdp=2, expert=2, tensor=2),
}
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1}


def all_to_all_bytes(hlo_text: str) -> int:
  """Bytes of all all_to_all results in a (per-device, partitioned) HLO module."""
  total = 0
  for line in hlo_text.splitlines():
    match = re.search(r"=\s*(.*?)\s+all-to-all(?:-start)?\(", line)
    if match:
      for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", match.group(1)):
        total += DTYPE_BYTES.get(dtype, 4) * int(np.prod([int(d) for d in dims.split(",") if d]))
  return total


def layer_fn(cfg, layout):
  """(params, x) -> (y, metrics): route, then dispatch on one device or across the mesh."""

  def layer(params, x):
    logits = x.astype(jnp.float32) @ params["router"]
    routing = call_router("topk", logits, cfg, train=True).routing
    if layout is None:
      return get_dispatcher(cfg.dispatch)(
        x, routing, functools.partial(swiglu_experts, params["experts"]), cfg
      )
    return expert_parallel_dispatch(
      x, routing, params["experts"], SwiGLUExperts.LOGICAL_AXES, swiglu_experts, cfg, layout
    )

  return layer


def compile_step(cfg, layout, params, x):
  """Compiled fwd+bwd of the layer (with the mesh's shardings) and its arguments."""
  fwd_bwd = with_backward(layer_fn(cfg, layout))
  args = (params, x, jnp.ones_like(x) / x.size)
  if layout is None:
    device = jax.devices()[0]
    return jax.jit(fwd_bwd).lower(*jax.device_put(args, device)).compile(), args

  def put(tree, axes):
    return jax.tree.map(lambda a: jax.device_put(a, layout.named(axes(a), a.shape)), tree)

  params = {
    "router": put(params["router"], lambda a: ("embed", None)),
    "experts": {
      k: put(w, lambda a, k=k: SwiGLUExperts.LOGICAL_AXES[k]) for k, w in params["experts"].items()
    },
  }
  x, d_out = (put(a, lambda a: ("batch", None)) for a in args[1:])
  jitted = jax.jit(lambda *a: _traced(layout, fwd_bwd, *a))
  return jitted.lower(params, x, d_out).compile(), (params, x, d_out)


def _traced(layout, fn, *args):
  with sharding.use_layout(layout):
    return fn(*args)


def rows(dims, mesh, factor, dispatch):
  """(compiled fwd+bwd, its arguments, model.moe) of the layer at dims = (T, d, f, E, k)
  on one device (mesh None) or on MESHES[mesh] with a2a capacity factor `factor`."""
  t, d, f, e, k = dims
  cfg = base_config().model.moe
  cfg.num_experts, cfg.top_k, cfg.expert_d_ff, cfg.dispatch = e, k, f, dispatch
  cfg = cfg.lock()
  rng = np.random.default_rng(0)

  def normal(*s):
    return jnp.asarray(rng.standard_normal(s) / np.sqrt(s[-2]), jnp.float32)

  params = {
    "router": normal(d, e),
    "experts": {"w_gate": normal(e, d, f), "w_up": normal(e, d, f), "w_down": normal(e, f, d)},
  }
  x = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
  layout = None
  if mesh is not None:
    sizes = {a: MESHES[mesh].get(a, 1) for a in sharding.MESH_AXES}
    layout = sharding.Layout(sharding.make_mesh(sizes), dict(sharding.RULES), "fixed", factor)
  return (*compile_step(cfg, layout, params, x), cfg)


def bench(dims, dispatch_paths, meshes, factors, reps):
  """One record per dispatch path and (1 device, or mesh and a2a factor)."""
  t, d, f, e, k = dims
  runs = {}
  for dispatch in dispatch_paths:
    runs[dispatch, "1 device", None] = rows(dims, None, 0.0, dispatch)
    for mesh in meshes:
      for factor in factors:
        runs[dispatch, mesh, factor] = rows(dims, mesh, factor, dispatch)
  outputs = {}
  for key, (compiled, args, _) in runs.items():
    outputs[key] = jax.block_until_ready(compiled(*args))  # warm-up
  times = medians(
    interleaved_times({key: lambda c=c, a=a: c(*a) for key, (c, a, _) in runs.items()}, reps)
  )
  records = []
  for (dispatch, mesh, factor), (compiled, _, cfg) in runs.items():
    metrics = outputs[dispatch, mesh, factor][1]
    median, single = times[dispatch, mesh, factor], times[dispatch, "1 device", None]
    sizes = MESHES.get(mesh, {})
    n_ep, shards = sizes.get("expert", 1), int(np.prod(list(sizes.values()) or [1]))
    capacity = capacity_of(cfg, t) if dispatch == "capacity" else None
    buffer_rows = n_ep * rows_per_peer(cfg, t // shards, k, n_ep, factor or 0.0, capacity)
    records.append(
      {
        "dispatch": dispatch,
        "mesh": mesh,
        "a2a_capacity_factor": factor,
        "T": t,
        "d": d,
        "f": f,
        "E": e,
        "k": k,
        "time_ms": 1e3 * median,
        "ratio_to_1_device": single / median,
        "a2a_bytes_per_step": all_to_all_bytes(compiled.as_text()),
        "a2a_rows_per_exchange": buffer_rows if mesh else 0,
        "routed_rows_per_device": t // shards * k if mesh else 0,
        "a2a_overflow_fraction": float(metrics.get("a2a_overflow_fraction", 0.0)),
        "dropped_fraction": float(metrics["dropped_fraction"]),
        "n_ep": n_ep,
      }
    )
  return records


def markdown(records) -> str:
  """The title, the command, the shape and machine, then one table row per record."""
  r0 = records[0]
  lines = [
    "# One MoE layer: expert parallel on 8 simulated CPU devices vs one device",
    "",
    "`python -m experiments.benchmarks.expert_parallel`",
    "",
    f"T={r0['T']}, d={r0['d']}, f={r0['f']}, E={r0['E']}, k={r0['k']}; fp32, fwd+bwd; "
    f"8 simulated devices on {os.cpu_count()} cores (jax {jax.__version__}); load "
    f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}.",
    "",
    markdown_table(
      [
        "dispatch",
        "layout",
        "a2a factor",
        "ms",
        "ratio to 1 device",
        "all_to_all MiB/step/device",
        "rows per exchange (buffer / routed)",
        "a2a overflow",
        "dropped",
      ],
      [
        [
          r["dispatch"],
          r["mesh"] or "1 device",
          r["a2a_capacity_factor"] or "-",
          f"{r['time_ms']:.1f}",
          f"{r['ratio_to_1_device']:.2f}",
          f"{r['a2a_bytes_per_step'] / 2**20:.2f}",
          (
            f"{r['a2a_rows_per_exchange']} / {r['routed_rows_per_device']}"
            if r["mesh"] and r["n_ep"] > 1
            else "-"
          ),
          f"{r['a2a_overflow_fraction']:.3f}",
          f"{r['dropped_fraction']:.3f}",
        ]
        for r in records
      ],
    ),
  ]
  return "\n".join(lines)
