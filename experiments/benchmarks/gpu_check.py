r"""One-shot GPU check: the compiled Triton grouped matmul against oracles, then its speed.

  python -m experiments.benchmarks.gpu_check --json=/tmp/gpu.json --markdown=/tmp/gpu.md

Made for a short accelerator lease: every part runs on its own (a failing
part is reported and the next one runs), and nothing here is a test (the
suite never needs a GPU). Parts:

1. correctness: ``gmm``/``tgmm`` with ``backend='pallas_gpu', interpret=False``
   (the compiled Triton kernels of kernels/gmm_gpu.py) on the edge layouts of
   tests/kernels (empty groups, mid-tile boundaries, m not a tile multiple,
   overflow clipping) and on larger random layouts, against float64 numpy.
   bf16 inputs with f32 output must match to 1e-5 relative to max|oracle|
   (bf16 products are exact in f32/TF32); f32 inputs are reported both as
   they run (TF32 tensor cores may be used) and checked at 2e-3. Gradients
   through the custom_vjp against jax.grad of the one-hot einsum.
2. speed (bf16, f32 accumulate): forward ``gmm``, ``tgmm`` and gmm fwd+bwd
   against ``jax.lax.ragged_dot`` (XLA's grouped GEMM) and the dense matmul of
   equal FLOPs ([m, d] @ [d, f]), at coarse, fine and finer MoE shapes, and on
   Hopper jax's own Pallas Mosaic GPU grouped matmuls (--mosaic block configs;
   forward only). Each row prints medians and the ratios dense/path (1.0 = the
   dense limit), measured in the same run; forward grouped paths also print
   their relative error against XLA's ragged_dot.

Every record is also printed as one JSON line as it is made, so a run cut
short by a timeout still leaves its figures in the log
(scripts/accelerator_check.sh reads them from there). --cases, --max_cases
and --shapes trim the run to a lease's budget.
"""

import json
import platform
import traceback

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from moejax import cli, cli_files
from moejax.kernels import gmm, gmm_reference, tgmm
from moejax.profiling.gmm_speed import (
  DRY_RUN_SHAPES,
  SPEED_SHAPES,
  check_speed,
  markdown,
  relative_error,
)
from tests.kernels.gmm_test_oracles import EDGE_LAYOUTS, numpy_gmm, numpy_tgmm

OUTPUTS = cli_files.study_outputs(plot=False)
_REPS = flags.DEFINE_integer("reps", 20, "Timed calls per path (median).")
_PARTS = flags.DEFINE_list("parts", ["correctness", "speed"], "Parts to run.")
_TILINGS = flags.DEFINE_list(
  "tilings",
  ["128:128:128", "128:64:128", "64:64:64"],
  "Triton tilings tm:tk:tn timed in the speed part.",
)
_DRY_RUN = flags.DEFINE_bool(
  "dry_run",
  False,
  "CPU rehearsal: interpret the kernels, tiny "
  "speed shapes, edge layouts only (checks the script, not the GPU).",
)
_CASES = flags.DEFINE_list(
  "cases",
  ["edge", "random"],
  "Correctness case sets, run in this "
  "order: edge (8 layouts x 3 (k, n) x tilings 128 and 16), random "
  "(4 larger random layouts; not in --dry_run).",
)
_MAX_CASES = flags.DEFINE_integer(
  "max_cases", 0, "Stop the correctness part after this many cases (0: all)."
)
_SHAPES = flags.DEFINE_list("shapes", list(SPEED_SHAPES), "Speed shapes (SPEED_SHAPES) by name.")
_MOSAIC = flags.DEFINE_list(
  "mosaic",
  ["128:128:64:4:1", "128:128:64:4:2", "64:128:64:4:1"],
  "Block configs block_m:block_n:block_k:max_concurrent_steps:grid_block_n of jax's "
  "Pallas Mosaic GPU grouped matmuls, timed in the speed part on Hopper GPUs only "
  "(empty: none).",
)
CASE_SETS = ("edge", "random")


def random_layout(rng, num_groups, m, fill=0.9):
  """Group sizes summing to about fill*m, some groups empty."""
  weights = rng.dirichlet(np.full(num_groups, 0.5))
  sizes = rng.multinomial(int(fill * m), weights)
  return [int(s) for s in sizes], m


def edge_cases():
  for name, (sizes, m) in EDGE_LAYOUTS.items():
    for k, n in ((16, 16), (32, 64), (40, 24)):
      yield f"{name}/k{k}n{n}", sizes, m, k, n, (128, 128, 128)
      yield f"{name}/k{k}n{n}/t16", sizes, m, k, n, (16, 16, 16)


def random_cases():
  rng = np.random.default_rng(0)
  for i, (groups, m, k, n) in enumerate(
    ((8, 1000, 256, 512), (64, 4096, 128, 256), (128, 3000, 256, 128), (3, 129, 300, 70))
  ):
    sizes, m = random_layout(rng, groups, m)
    if _DRY_RUN.value:
      return
    yield f"random{i}/E{groups}m{m}k{k}n{n}", sizes, m, k, n, (128, 128, 128)


def correctness_cases():
  sets = {"edge": edge_cases, "random": random_cases}
  count = 0
  for name in _CASES.value:
    for case in sets[name]():
      if _MAX_CASES.value and count >= _MAX_CASES.value:
        return
      count += 1
      yield case


def check_correctness(records):
  rng = np.random.default_rng(1)
  failures = 0
  for name, sizes, m, k, n, tiling in correctness_cases():
    lhs = rng.standard_normal((m, k)).astype(np.float32)
    rhs = rng.standard_normal((len(sizes), k, n)).astype(np.float32)
    grad = rng.standard_normal((m, n)).astype(np.float32)
    gs = jnp.asarray(sizes, jnp.int32)
    kw = dict(backend="pallas_gpu", interpret=_DRY_RUN.value, tiling=tiling)
    rec = {"part": "correctness", "case": name}
    try:
      lb, rb, gb = (jnp.asarray(a, jnp.bfloat16) for a in (lhs, rhs, grad))
      exact = [np.asarray(a.astype(jnp.float32)) for a in (lb, rb, gb)]
      rec["gmm_bf16"] = relative_error(
        gmm(lb, rb, gs, preferred_element_type=jnp.float32, **kw),
        numpy_gmm(exact[0], exact[1], sizes),
      )
      rec["tgmm_bf16"] = relative_error(
        tgmm(lb, gb, gs, preferred_element_type=jnp.float32, **kw),
        numpy_tgmm(exact[0], exact[2], sizes),
      )
      rec["gmm_f32"] = relative_error(gmm(lhs, rhs, gs, **kw), numpy_gmm(lhs, rhs, sizes))
      rec["tgmm_f32"] = relative_error(tgmm(lhs, grad, gs, **kw), numpy_tgmm(lhs, grad, sizes))

      def loss(a, b, fn):
        return jnp.sum(fn(a, b) * grad)

      def kernel_fn(a, b):
        return gmm(a, b, gs, **kw)

      def ref_fn(a, b):
        return gmm_reference(a, b, gs)

      g_kernel = jax.grad(loss, argnums=(0, 1))(lhs, rhs, kernel_fn)
      g_ref = jax.grad(loss, argnums=(0, 1))(lhs, rhs, ref_fn)
      rec["grad_f32"] = max(relative_error(a, b) for a, b in zip(g_kernel, g_ref))
      ok = (
        rec["gmm_bf16"] < 1e-5
        and rec["tgmm_bf16"] < 1e-5
        and rec["gmm_f32"] < 2e-3
        and rec["tgmm_f32"] < 2e-3
        and rec["grad_f32"] < 2e-3
      )
      rec["ok"] = bool(ok)
    except Exception as e:  # report and go on: one lease, many checks
      rec["ok"], rec["error"] = False, f"{type(e).__name__}: {str(e)[:300]}"
    failures += not rec["ok"]
    records.append(rec)
    print(json.dumps(rec), flush=True)
  print(
    f"correctness: {sum(r['ok'] for r in records if r['part'] == 'correctness')} ok, "
    f"{failures} failed",
    flush=True,
  )


def main(argv):
  del argv
  for flag, valid in ((_CASES, CASE_SETS), (_SHAPES, SPEED_SHAPES)):
    unknown = sorted(set(flag.value) - set(valid))
    if unknown:
      raise cli.flag_error(flag, f"{unknown}: expected names in {sorted(valid)}")
  for spec in _MOSAIC.value:
    fields = spec.split(":")
    if len(fields) != 5 or not all(f.isdigit() and int(f) > 0 for f in fields):
      raise cli.flag_error(
        _MOSAIC,
        f"{spec!r}: expected block_m:block_n:block_k:max_concurrent_steps:grid_block_n, "
        "five positive integers",
      )
  OUTPUTS.check()
  print(f"jax {jax.__version__} on {jax.devices()} ({platform.node()})", flush=True)
  records = []
  shapes = DRY_RUN_SHAPES if _DRY_RUN.value else {n: SPEED_SHAPES[n] for n in _SHAPES.value}
  parts = {
    "correctness": check_correctness,
    "speed": lambda records: check_speed(
      records, shapes, _TILINGS.value, _REPS.value, _DRY_RUN.value, _MOSAIC.value
    ),
  }
  for part, fn in parts.items():
    if part in _PARTS.value:
      try:
        fn(records)
      except Exception:
        traceback.print_exc()
  report = markdown(records)
  print(report)
  OUTPUTS.write(records, report)
  return 0 if all(r.get("ok", True) for r in records) else 1


if __name__ == "__main__":
  cli.run(main)  # exits with main's status
