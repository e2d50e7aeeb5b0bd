"""The MoE layer benchmark's paths (experiments/benchmarks/moe_layer.py): router +
dispatch + SwiGLU experts per dispatch path, the equal-FLOP dense SwiGLU, the
routing-and-layout overhead alone and OmniMoE's atomic experts, each as fn(params,
x) -> (y, padding waste), compiled and timed interleaved per shape. What each path
and figure means: the benchmark's docstring.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from moejax.assignment.blocks import granule
from moejax.assignment.layout import padding_waste
from moejax.config import base_config
from moejax.dispatch import get_dispatcher
from moejax.dispatch.dropless import get_grouped_matmul
from moejax.experts import swiglu_experts
from moejax.profiling import anchors
from moejax.profiling.timing import compile_pass, interleaved_times
from moejax.routing import call_router

PRESETS = {  # T, d, f, E, k
  "coarse": (4096, 512, 1024, 8, 2),
  "fine": (4096, 512, 256, 64, 8),
  "finer": (4096, 512, 128, 128, 8),
  "lm": (4096, 128, 256, 8, 2),  # the default LM's MoE layer (32 x 128 tokens)
  "omni": (4096, 128, 14, 4096, 32),  # configs/lm_shakespeare_omnimoe.py (omnimoe paths)
}
OMNI_PATHS = ("omnimoe/naive", "omnimoe/expert_centric", "omnimoe/expert_centric_loop")
PATHS = (
  "dense",
  "routing_layout",
  "capacity",
  "dropless/loop",
  "dropless/tiled",
  "dropless/ragged_dot",
  "dropless/gmm",
  "dropless_memeff",
  "anchor/gshard_einsum",
  "anchor/sort_ragged_dot",
)
SLOW = ("dropless/ragged_dot", "dropless/gmm", "anchor/gshard_einsum", "anchor/sort_ragged_dot")
PLAIN_SORT_GATHER = "dropless/loop"  # the autodiff twin of dropless_memeff


def moe_cfg(settings: dict, num_experts, top_k, **overrides):
  """model.moe with E and k, then `settings` (the benchmark's flags: dropless tile and
  blocks, capacity factor, router) and `overrides` (the path's) applied."""
  c = base_config().model.moe
  c.num_experts, c.top_k = num_experts, top_k
  c.update(settings)
  c.update(overrides)
  return c.lock()


def route(params, x, cfg):
  """The Routing of cfg.router on x @ params['router'] (train mode)."""
  logits = x.astype(jnp.float32) @ params["router"]
  return call_router(cfg.router, logits, cfg, train=True).routing


def capacity_waste(metrics, num_tokens, top_k, num_experts):
  """Capacity slots left empty / assignments kept."""
  kept = num_tokens * top_k * (1 - metrics["dropped_fraction"])
  return (num_experts * metrics["capacity"] - kept) / kept


def make_path(name, dims, settings: dict, omni_tile: int):
  """fn(params, x) -> (y, padding_waste), and its parameters (moe_cfg: `settings`;
  the omnimoe paths at dropless tile `omni_tile`)."""
  t, d, f, e, k = dims
  rng = np.random.default_rng(0)

  def normal(*s):
    return jnp.asarray(rng.standard_normal(s) / np.sqrt(s[-2]), jnp.float32)

  if name == "dense":
    params = {"w_gate": normal(d, k * f), "w_up": normal(d, k * f), "w_down": normal(k * f, d)}

    def dense(params, x):
      hidden = jax.nn.silu(x @ params["w_gate"]) * (x @ params["w_up"])
      return hidden @ params["w_down"], jnp.zeros((), jnp.float32)

    return dense, params
  if name in OMNI_PATHS:
    return make_omni_path(name, dims, normal, settings, omni_tile)
  params = {
    "router": normal(d, e),
    "experts": {"w_gate": normal(e, d, f), "w_up": normal(e, d, f), "w_down": normal(e, f, d)},
  }
  if name == "routing_layout":
    return routing_layout_path(moe_cfg(settings, e, k)), {"router": params["router"]}
  kind, _, matmul = name.partition("/")
  if kind == "anchor":
    dispatch = anchors.gshard_einsum if matmul == "gshard_einsum" else get_dispatcher("dropless")
    cfg = moe_cfg(settings, e, k, grouped_matmul="ragged_dot", dropless={"tile": 1})
  else:
    dispatch = get_dispatcher(kind)
    cfg = moe_cfg(settings, e, k, grouped_matmul=matmul or "auto")
  # the loop paths compute each group up to the granule, not the tile (blocks.py)
  loops = kind == "dropless_memeff" or (
    kind == "dropless"
    and get_grouped_matmul(cfg.grouped_matmul, functools.partial(swiglu_experts, params["experts"]))
    in ("fused", "loop")
  )
  tile = cfg.dropless.tile
  unit = granule(tile, cfg.dropless.min_block) if loops else tile

  def moe(params, x):
    routing = route(params, x, cfg)
    y, metrics = dispatch(x, routing, functools.partial(swiglu_experts, params["experts"]), cfg)
    if "padding_waste" in metrics:
      counts = jnp.sum(
        jax.nn.one_hot(routing.expert_index, e, dtype=jnp.int32) * routing.valid[..., None],
        axis=(0, 1),
      )
      return y, padding_waste(counts, unit)
    return y, capacity_waste(metrics, t, k, e)

  return moe, params


def routing_layout_path(cfg):
  """Router + layout + per-row gates + block schedule, no experts. y = x * (sum of the
  token's combine weights), so the backward runs the router's; every layout array
  feeds the second output, so none is compiled away."""
  from moejax.assignment.blocks import schedule_of
  from moejax.assignment.layout import tile_layout

  def overhead(params, x):
    routing = route(params, x, cfg)
    layout = tile_layout(routing, cfg.num_experts, cfg.dropless.tile)
    row_gate = layout.row_values(routing.masked_weight().T.reshape(-1))
    used = sum(
      jnp.sum(p.start) + jnp.sum(p.expert) + p.count for p in schedule_of(layout, cfg.dropless)
    ) + jnp.sum(layout.row_token)
    y = x * jnp.sum(routing.masked_weight(), axis=1, keepdims=True)
    return y, (jax.lax.stop_gradient(jnp.sum(row_gate)) + used.astype(jnp.float32)) * 0.0

  return overhead


def make_omni_path(name, dims, normal, settings: dict, omni_tile: int):
  """Router + atomic experts of OmniMoE over E = N = n^2 experts (no shared SwiGLU)."""
  from moejax.experts.atomic import ATOMIC, atomic_naive
  from moejax.routing.product_key import grid_size, route_product_key

  t, d, f, e, k = dims
  n = grid_size(e)
  params = {
    "router_x": normal(d, n),
    "router_y": normal(d, n),
    "u": normal(e, d) * np.sqrt(e / d),
    "d": normal(e, d) * np.sqrt(e / d),
  }  # std 1/sqrt(d), as the layer's init
  stats = {
    "mean_x": jnp.zeros(n),
    "var_x": jnp.ones(n),
    "mean_y": jnp.zeros(n),
    "var_y": jnp.ones(n),
  }
  matmul = "loop" if name.endswith("_loop") else "tiled"
  cfg = moe_cfg(settings, e, k, grouped_matmul=matmul, dropless={"tile": omni_tile})

  def omni(params, x):
    routing, _, _ = route_product_key(
      x @ params["router_x"],
      x @ params["router_y"],
      stats,
      top_k=k,
      per_axis_k=min(k, n),
      train=True,
    )
    if name == "omnimoe/naive":
      return atomic_naive(x, params["u"], params["d"], routing, "silu"), jnp.zeros(())
    experts = ATOMIC.bind({"u": params["u"][:, :, None], "d": params["d"][:, None, :]})
    y, metrics = get_dispatcher("dropless")(x, routing, experts, cfg)
    return y, metrics["padding_waste"]

  return omni, params


def bench_shape(
  label, dims, paths, passes, settings: dict, *, omni_tile, reps, slow_reps, max_temp_bytes
):
  """One record per path and pass at `dims`: median time over `reps` interleaved
  rounds (`slow_reps` for SLOW), ratio to dense, temp bytes, padding waste; a path
  compiling to more than `max_temp_bytes` of temp memory is recorded as skipped."""
  t, d, f, e, k = dims
  x = jnp.asarray(np.random.default_rng(1).standard_normal((t, d)), jnp.float32)
  runs = {}  # (path, pass) -> (compiled, args, temp)
  skipped = {}  # (path, pass) -> temp bytes over --max_temp_gib
  for name in paths:
    fn, params = make_path(name, dims, settings, omni_tile)
    for which in passes:
      compiled, args, temp = compile_pass(fn, params, x, which)
      if temp > max_temp_bytes:
        skipped[name, which] = temp
        continue
      if name not in SLOW:  # one untimed call (first-call costs); slow paths are too slow
        jax.block_until_ready(compiled(*args))
      runs[name, which] = (compiled, args, temp)
  last: dict = {}  # (path, pass) -> its last output (y, padding waste)

  def call(key):
    last[key] = runs[key][0](*runs[key][1])
    return last[key]

  times = interleaved_times(
    {key: functools.partial(call, key) for key in runs},
    {key: slow_reps if key[0] in SLOW else reps for key in runs},
  )

  def record(name, which, temp, **figures):
    return {
      "shape": label,
      "T": t,
      "d": d,
      "f": f,
      "E": e,
      "k": k,
      "path": name,
      "pass": which,
      **figures,
      "temp_bytes": temp,
      "dropless_tile": settings["dropless"]["tile"],  # the records' field name
    }

  records = []
  for (name, which), (_, _, temp) in runs.items():
    median, dense = np.median(times[name, which]), np.median(times["dense", which])
    records.append(
      record(
        name,
        which,
        temp,
        time_ms=1e3 * float(median),
        ratio_to_dense=float(dense / median),
        padding_waste=float(last[name, which][1]),
        reps=len(times[name, which]),
      )
    )
  for (name, which), temp in skipped.items():
    records.append(
      record(
        name,
        which,
        temp,
        time_ms=None,
        ratio_to_dense=None,
        padding_waste=None,
        reps=0,
        skipped=f"temp {temp / 2**30:.1f} GiB > --max_temp_gib",
      )
    )
  return records
