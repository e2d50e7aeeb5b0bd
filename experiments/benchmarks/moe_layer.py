r"""MoE layer speed and memory on this machine: every dispatch path vs the equal-FLOP dense SwiGLU.

  python -m experiments.benchmarks.moe_layer                      # coarse + fine
  python -m experiments.benchmarks.moe_layer --shapes=lm,256:64:32:8:2 --reps=3
  python -m experiments.benchmarks.moe_layer --json=/tmp/r.json --markdown=/tmp/r.md

Shapes are presets (coarse, fine, lm) or T:d:f:E:k. For each shape, the
router (--router, default softmax top-k; float32) + dispatch + SwiGLU experts
is timed forward and forward+backward (gradients for x, router and expert
weights), next to a dense SwiGLU of width k*f (the same expert FLOPs per token). Reported per
path and pass: median time, ratio = dense time / path time (1.0 = the dense
limit), compiled temp memory (`memory_analysis().temp_size_in_bytes`) and
computed padding waste (rows computed beyond the real ones / real rows: at the
dropless tile --tile, or for the loop paths at their granule gcd(--tile, --min_block)).

Paths:
  dense                     SwiGLU d_ff = k*f, no router
  routing_layout            only what every dropless path adds before its experts: router
                            logits, top-k, the sort into the tile layout, the per-row gates
                            and the block schedule (its fwd+bwd: the router's gradient
                            through the combine weights); the report gives its time as a
                            share of dense ("overhead"), the rest of a path is its expert pass
  capacity                  GShard capacity (cf --capacity_factor), index scatter, no one-hot
  dropless/<matmul>         dropless dispatch with grouped_matmul loop|tiled|ragged_dot|gmm
  dropless_memeff           SonicMoE custom-VJP path (moejax/dispatch/memeff.py); the same
                            as dropless/fused, which grouped_matmul 'auto' picks on CPU
  anchor/gshard_einsum      GShard one-hot dispatch/combine einsums [T, E, C] (cf as capacity)
  anchor/sort_ragged_dot    sort, then jax.lax.ragged_dot on unpadded groups (tile 1)
  omnimoe/naive             OmniMoE (moejax/experts/atomic.py): product-key router (train
                            mode) + E = N atomic experts, top-k, token-centric [T, k, d]
                            gathers of u and d; not run by default (E must be a square)
  omnimoe/expert_centric    the same, expert-centric (dropless layout, tiled matmul,
                            tile --omni_tile); omnimoe/expert_centric_loop: loop matmul
  The omnimoe paths leave out the shared SwiGLU (the same in both); preset 'omni'
  (the OmniMoE LM's layer) sets f so that dense = k*f = 448 is that shared SwiGLU.
  The report adds ratio = naive time / expert-centric time, same run.
A path whose compiled temp memory exceeds --max_temp_gib is not run (the
table says 'skipped', with its temp memory). Each path is compiled ahead and
called once untimed; repetitions are then interleaved (round r runs every
path once, order rotated by r) and medians taken: the machine is shared and
noisy. Paths that cost E x the FLOPs on CPU (ragged_dot, gmm reference,
one-hot einsum) skip the untimed call and run --slow_reps times.
"""

import datetime
import functools
import os

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from moejax import cli, cli_files
from moejax.config import base_config
from moejax.dispatch import get_dispatcher
from moejax.assignment.blocks import granule
from moejax.assignment.layout import padding_waste
from moejax.dispatch.dropless import get_grouped_matmul
from moejax.experts import swiglu_experts
from moejax.profiling import anchors, report
from moejax.profiling.timing import compile_pass, cpu_model, interleaved_times
from moejax.routing import get_router

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

_SHAPES = flags.DEFINE_list("shapes", ["coarse", "fine"], "Presets or T:d:f:E:k.")
_PATHS = flags.DEFINE_list("paths", list(PATHS), "Paths to run (dense is always run).")
_PASSES = flags.DEFINE_list("passes", ["fwd", "fwd+bwd"], "fwd and/or fwd+bwd.")
_REPS = flags.DEFINE_integer("reps", 5, "Interleaved repetitions (median).")
_SLOW_REPS = flags.DEFINE_integer("slow_reps", 1, "Repetitions of the E x FLOPs paths.")
_TILE = cli.checked(flags.DEFINE_integer("tile", 128, "model.moe.dropless_tile."), cli.at_least(1))
_MIN_BLOCK = cli.checked(
  flags.DEFINE_integer(
    "min_block", 128, "model.moe.dropless_min_block (loop paths; 64 for fine-grained shapes)."
  ),
  cli.at_least(1),
)
_BLOCK = cli.checked(
  flags.DEFINE_integer("block", 512, "model.moe.dropless_block (loop paths)."), cli.at_least(1)
)
_ROUTER = flags.DEFINE_string(
  "router",
  "topk",
  "model.moe.router of the MoE paths, e.g. "
  "topk_rounded (token rounding, train mode) with --rounding_*.",
)
_ROUNDING_TILE = flags.DEFINE_integer("rounding_tile", 128, "model.moe.topk_rounded.tile.")
_ROUNDING_MODE = flags.DEFINE_string("rounding_mode", "nearest", "model.moe.topk_rounded.mode.")
_CF = flags.DEFINE_float("capacity_factor", 1.25, "Capacity factor (capacity, gshard).")
_MAX_TEMP = flags.DEFINE_float(
  "max_temp_gib", 6.0, "Skip (and report) a path whose compiled temp memory is larger."
)
_OMNI_TILE = flags.DEFINE_integer(
  "omni_tile", 8, "model.moe.dropless_tile of omnimoe/expert_centric*."
)
OUTPUTS = cli_files.study_outputs(plot=False)  # --json: one record per shape, path and pass


def parse_shape(spec: str):
  if spec in PRESETS:
    return spec, PRESETS[spec]
  dims = tuple(int(v) for v in spec.split(":"))
  if len(dims) != 5:
    raise app.UsageError(f"--shapes entry {spec!r}: a preset {sorted(PRESETS)} or T:d:f:E:k")
  return spec, dims


def moe_cfg(num_experts, top_k, **overrides):
  c = base_config().model.moe
  c.num_experts, c.top_k, c.dropless_tile, c.capacity_factor = (
    num_experts,
    top_k,
    _TILE.value,
    _CF.value,
  )
  c.dropless_min_block, c.dropless_block = _MIN_BLOCK.value, _BLOCK.value
  c.router = _ROUTER.value
  c.topk_rounded.tile, c.topk_rounded.mode = _ROUNDING_TILE.value, _ROUNDING_MODE.value
  c.update(overrides)
  return c.lock()


def route(params, x, cfg):
  logits = x.astype(jnp.float32) @ params["router"]
  spec = get_router(cfg.router)
  state = spec.init_state(cfg.num_experts) if spec.init_state else {}
  return spec.route(logits, cfg=cfg, state=state, rng=None, train=True).routing


def capacity_waste(metrics, num_tokens, top_k, num_experts):
  kept = num_tokens * top_k * (1 - metrics["dropped_fraction"])
  return (num_experts * metrics["capacity"] - kept) / kept


def make_path(name, dims):
  """fn(params, x) -> (y, padding_waste), and its parameters."""
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
    return make_omni_path(name, dims, normal)
  params = {
    "router": normal(d, e),
    "experts": {"w_gate": normal(e, d, f), "w_up": normal(e, d, f), "w_down": normal(e, f, d)},
  }
  if name == "routing_layout":
    return routing_layout_path(moe_cfg(e, k)), {"router": params["router"]}
  kind, _, matmul = name.partition("/")
  if kind == "anchor":
    dispatch = anchors.gshard_einsum if matmul == "gshard_einsum" else get_dispatcher("dropless")
    cfg = moe_cfg(e, k, grouped_matmul="ragged_dot", dropless_tile=1)
  else:
    dispatch = get_dispatcher(kind)
    cfg = moe_cfg(e, k, grouped_matmul=matmul or "auto")
  # the loop paths compute each group up to the granule, not the tile (blocks.py)
  loops = kind == "dropless_memeff" or (
    kind == "dropless"
    and get_grouped_matmul(cfg.grouped_matmul, functools.partial(swiglu_experts, params["experts"]))
    in ("fused", "loop")
  )
  unit = granule(cfg.dropless_tile, cfg.dropless_min_block) if loops else cfg.dropless_tile

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
    layout = tile_layout(routing, cfg.num_experts, cfg.dropless_tile)
    row_gate = layout.row_values(routing.masked_weight().T.reshape(-1))
    used = sum(
      jnp.sum(p.start) + jnp.sum(p.expert) + p.count for p in schedule_of(layout, cfg)
    ) + jnp.sum(layout.row_token)
    y = x * jnp.sum(routing.masked_weight(), axis=1, keepdims=True)
    return y, (jax.lax.stop_gradient(jnp.sum(row_gate)) + used.astype(jnp.float32)) * 0.0

  return overhead


def make_omni_path(name, dims, normal):
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
  cfg = moe_cfg(e, k, grouped_matmul=matmul, dropless_tile=_OMNI_TILE.value)

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


def bench_shape(label, dims, paths, passes):
  t, d, f, e, k = dims
  x = jnp.asarray(np.random.default_rng(1).standard_normal((t, d)), jnp.float32)
  runs = {}  # (path, pass) -> (compiled, args, temp)
  skipped = {}  # (path, pass) -> temp bytes over --max_temp_gib
  for name in paths:
    fn, params = make_path(name, dims)
    for which in passes:
      compiled, args, temp = compile_pass(fn, params, x, which)
      if temp > _MAX_TEMP.value * 2**30:
        skipped[name, which] = temp
        continue
      if name not in SLOW:  # one untimed call (first-call costs); slow paths are too slow
        jax.block_until_ready(compiled(*args))
      runs[name, which] = (compiled, args, temp)
  last = {}  # (path, pass) -> its last output (y, padding waste)

  def call(key):
    last[key] = runs[key][0](*runs[key][1])
    return last[key]

  times = interleaved_times(
    {key: functools.partial(call, key) for key in runs},
    {key: _SLOW_REPS.value if key[0] in SLOW else _REPS.value for key in runs},
  )
  records = []
  for (name, which), (_, _, temp) in runs.items():
    median, dense = np.median(times[name, which]), np.median(times["dense", which])
    records.append(
      {
        "shape": label,
        "T": t,
        "d": d,
        "f": f,
        "E": e,
        "k": k,
        "path": name,
        "pass": which,
        "time_ms": 1e3 * float(median),
        "ratio_to_dense": float(dense / median),
        "temp_bytes": temp,
        "padding_waste": float(last[name, which][1]),
        "reps": len(times[name, which]),
        "dropless_tile": _TILE.value,
      }
    )
  for (name, which), temp in skipped.items():
    records.append(
      {
        "shape": label,
        "T": t,
        "d": d,
        "f": f,
        "E": e,
        "k": k,
        "path": name,
        "pass": which,
        "time_ms": None,
        "ratio_to_dense": None,
        "temp_bytes": temp,
        "padding_waste": None,
        "reps": 0,
        "dropless_tile": _TILE.value,
        "skipped": f"temp {temp / 2**30:.1f} GiB > --max_temp_gib",
      }
    )
  return records


def markdown(records) -> str:
  rounding = (
    f" ({_ROUNDING_MODE.value}, tile {_ROUNDING_TILE.value})"
    if _ROUTER.value == "topk_rounded"
    else ""
  )
  settings = (
    f"fp32; router {_ROUTER.value}{rounding}; dropless_tile={_TILE.value}, "
    f"dropless_min_block={_MIN_BLOCK.value}, dropless_block={_BLOCK.value}, "
    f"capacity_factor={_CF.value}; medians of {_REPS.value} interleaved reps "
    f"({_SLOW_REPS.value} for the E x FLOPs paths). ratio = dense time / path time."
  )
  return report.moe_layer_tables(
    records, settings, PLAIN_SORT_GATHER, OMNI_PATHS[0], OMNI_PATHS[1:], _OMNI_TILE.value
  )


def main(argv):
  del argv
  paths = ["dense"] + [p for p in _PATHS.value if p != "dense"]
  unknown = set(paths) - set(PATHS) - set(OMNI_PATHS)
  if unknown:
    raise app.UsageError(f"unknown --paths {sorted(unknown)}; valid: {PATHS + OMNI_PATHS}")
  OUTPUTS.check()
  records = []
  for spec in _SHAPES.value:
    label, dims = parse_shape(spec)
    records += bench_shape(label, dims, paths, _PASSES.value)
    print(markdown([r for r in records if r["shape"] == label]), flush=True)
  OUTPUTS.write(
    {
      "machine": cpu_model(),
      "cores": os.cpu_count(),
      "jax": jax.__version__,
      "date": datetime.date.today().isoformat(),
      "loadavg": os.getloadavg(),
      "records": records,
    },
    markdown(records),
  )


if __name__ == "__main__":
  cli.run(main)
