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
import os

from absl import app, flags
import jax

from moejax import cli, cli_files
from moejax.profiling import report
from moejax.profiling.moe_layer import (
  OMNI_PATHS,
  PATHS,
  PRESETS,
  PLAIN_SORT_GATHER,
  bench_shape,
)
from moejax.profiling.timing import cpu_model

_SHAPES = flags.DEFINE_list("shapes", ["coarse", "fine"], "Presets or T:d:f:E:k.")
_PATHS = flags.DEFINE_list("paths", list(PATHS), "Paths to run (dense is always run).")
_PASSES = flags.DEFINE_list("passes", ["fwd", "fwd+bwd"], "fwd and/or fwd+bwd.")
_REPS = flags.DEFINE_integer("reps", 5, "Interleaved repetitions (median).")
_SLOW_REPS = flags.DEFINE_integer("slow_reps", 1, "Repetitions of the E x FLOPs paths.")
_TILE = cli.checked(flags.DEFINE_integer("tile", 128, "model.moe.dropless.tile."), cli.at_least(1))
_MIN_BLOCK = cli.checked(
  flags.DEFINE_integer(
    "min_block", 128, "model.moe.dropless.min_block (loop paths; 64 for fine-grained shapes)."
  ),
  cli.at_least(1),
)
_BLOCK = cli.checked(
  flags.DEFINE_integer("block", 512, "model.moe.dropless.block (loop paths)."), cli.at_least(1)
)
_ROUTER = flags.DEFINE_string(
  "router",
  "topk",
  "model.moe.router of the MoE paths, e.g. "
  "topk_rounded (token rounding, train mode) with --rounding_*.",
)
_ROUNDING_TILE = flags.DEFINE_integer("rounding_tile", 128, "model.moe.topk_rounded.tile.")
_ROUNDING_MODE = flags.DEFINE_string("rounding_mode", "nearest", "model.moe.topk_rounded.mode.")
_CF = flags.DEFINE_float("capacity_factor", 1.25, "model.moe.capacity.factor (capacity, gshard).")
_MAX_TEMP = flags.DEFINE_float(
  "max_temp_gib", 6.0, "Skip (and report) a path whose compiled temp memory is larger."
)
_OMNI_TILE = flags.DEFINE_integer(
  "omni_tile", 8, "model.moe.dropless.tile of omnimoe/expert_centric*."
)
OUTPUTS = cli_files.study_outputs(plot=False)  # --json: one record per shape, path and pass


def moe_settings() -> dict:
  """The model.moe settings the flags give every MoE path."""
  return {
    "dropless": {"tile": _TILE.value, "block": _BLOCK.value, "min_block": _MIN_BLOCK.value},
    "capacity": {"factor": _CF.value},
    "router": _ROUTER.value,
    "topk_rounded": {"tile": _ROUNDING_TILE.value, "mode": _ROUNDING_MODE.value},
  }


def markdown(records) -> str:
  rounding = (
    f" ({_ROUNDING_MODE.value}, tile {_ROUNDING_TILE.value})"
    if _ROUTER.value == "topk_rounded"
    else ""
  )
  settings = (
    f"fp32; router {_ROUTER.value}{rounding}; dropless.tile={_TILE.value}, "
    f"dropless.min_block={_MIN_BLOCK.value}, dropless.block={_BLOCK.value}, "
    f"capacity.factor={_CF.value}; medians of {_REPS.value} interleaved reps "
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
  shapes = [cli.preset_or_ints(s, PRESETS, "T:d:f:E:k", "shapes") for s in _SHAPES.value]
  OUTPUTS.check()
  records = []
  for label, dims in shapes:
    records += bench_shape(
      label,
      dims,
      paths,
      _PASSES.value,
      moe_settings(),
      omni_tile=_OMNI_TILE.value,
      reps=_REPS.value,
      slow_reps=_SLOW_REPS.value,
      max_temp_bytes=_MAX_TEMP.value * 2**30,
    )
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
