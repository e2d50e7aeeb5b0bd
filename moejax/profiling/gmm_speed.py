"""The GPU check's speed part and report (experiments/benchmarks/gpu_check.py): the
compiled Triton grouped matmul (moejax/kernels gmm, tgmm) timed against
jax.lax.ragged_dot, the dense matmul of equal FLOPs and, on Hopper, jax's own Pallas
Mosaic GPU grouped matmuls (jax.experimental.pallas.ops.gpu), and the check's markdown.
"""

import json
import statistics
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from moejax.evaluation.stats import markdown_table
from moejax.kernels import gmm, tgmm
from moejax.profiling.timing import blocked_times

# name: (tokens T, d, f, experts E, top_k): m = T * k grouped rows.
SPEED_SHAPES = {
  "coarse": (16384, 2048, 1024, 8, 2),
  "fine": (16384, 2048, 256, 64, 8),
  "finer": (16384, 2048, 128, 128, 8),
}
DRY_RUN_SHAPES = {"dry_run": (64, 32, 32, 4, 2)}


def timed(fn, *args, reps):
  """Median seconds of fn(*args) over `reps` calls after an untimed one."""
  blocked_times(lambda: fn(*args), 1)
  return statistics.median(blocked_times(lambda: fn(*args), reps))


def balanced_sizes(rng, num_groups, m):
  """Top-k-like loads: multinomial with mild skew, summing to m exactly."""
  weights = rng.dirichlet(np.full(num_groups, 20.0))
  return jnp.asarray(rng.multinomial(m, weights), jnp.int32)


def is_hopper() -> bool:
  """Whether the default device is an NVIDIA GPU of compute capability 9.x (H100, H200),
  the one generation jax's Hopper Mosaic GPU kernels target."""
  device = jax.devices()[0]
  return device.platform == "gpu" and str(getattr(device, "compute_capability", "")).startswith("9")


def mosaic_paths(x, w, dy, gs, configs) -> dict[str, tuple[Callable, tuple]]:
  """jax's Pallas Mosaic GPU grouped matmuls for Hopper, forward only (they define no
  VJP): ragged_dot_mgpu.ragged_dot ([m, d] x [E, d, f], gmm's contraction) and
  transposed_ragged_dot_mgpu.transposed_ragged_dot (x^T dy per group, tgmm's), one pair
  per block config 'block_m:block_n:block_k:max_concurrent_steps:grid_block_n'."""
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu

  paths: dict[str, tuple[Callable, tuple]] = {}
  for spec in configs:
    bm, bn, bk, steps, grid_n = (int(v) for v in spec.split(":"))
    kw = dict(block_m=bm, block_n=bn, block_k=bk, max_concurrent_steps=steps, grid_block_n=grid_n)
    paths[f"mgpu_gmm{spec}"] = (
      jax.jit(lambda a, b, g, kw=kw: ragged_dot_mgpu.ragged_dot(a, b, group_sizes=g, **kw)),
      (x, w, gs),
    )
    paths[f"mgpu_tgmm{spec}"] = (
      jax.jit(
        lambda a, b, g, kw=kw: transposed_ragged_dot_mgpu.transposed_ragged_dot(
          a, b, group_sizes=g, **kw
        )
      ),
      (x, dy, gs),
    )
  return paths


def relative_error(got, want) -> float:
  """max |got - want| / max |want|, in float64."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def check_speed(
  records, shapes: dict, tilings, reps: int, interpret: bool, mosaic_configs=()
) -> None:
  """Appends (and prints as a JSON line) one record per shape {name: (T, d, f, E, k)},
  pass and path: bf16 dense matmul, ragged_dot, gmm / tgmm at each tiling 'tm:tk:tn'
  (Triton, `interpret` on CPU) and, on a Hopper GPU, the Mosaic GPU kernels at each of
  `mosaic_configs` (`mosaic_paths`); median ms over `reps` calls, TFLOP/s and dense time
  / path time. Forward paths also carry their relative error against XLA's
  ragged_dot (gmm's contraction) or its gradient in the weights (tgmm's). A path that
  fails is printed and left out."""
  rng = np.random.default_rng(2)
  for shape, (tokens, d, f, experts, top_k) in shapes.items():
    m = tokens * top_k
    flops = 2.0 * m * d * f
    x = jnp.asarray(rng.standard_normal((m, d)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((experts, d, f)) / np.sqrt(d), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((m, f)), jnp.bfloat16)
    dense_w = w[0]
    gs = balanced_sizes(rng, experts, m)
    paths: dict[str, tuple[Callable, tuple]] = {
      "dense": (
        jax.jit(
          lambda a, b, g: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
        ),
        (x, dense_w, gs),
      ),
      "ragged_dot": (
        jax.jit(
          lambda a, b, g: jax.lax.ragged_dot(a, b, g, preferred_element_type=jnp.float32).astype(
            jnp.bfloat16
          )
        ),
        (x, w, gs),
      ),
    }
    fwd_bwd: dict[str, Callable] = {
      "dense": lambda a, b, g: jnp.sum(
        (jnp.dot(a, b, preferred_element_type=jnp.float32) * dy.astype(jnp.float32))
      ),
      "ragged_dot": lambda a, b, g: jnp.sum(
        jax.lax.ragged_dot(a, b, g, preferred_element_type=jnp.float32) * dy.astype(jnp.float32)
      ),
    }
    for spec in tilings:
      tiling = tuple(int(v) for v in spec.split(":"))
      kw = dict(
        backend="pallas_gpu",
        interpret=interpret,
        tiling=tiling,
        preferred_element_type=jnp.bfloat16,
      )
      paths[f"gmm{spec}"] = (jax.jit(lambda a, b, g, kw=kw: gmm(a, b, g, **kw)), (x, w, gs))
      paths[f"tgmm{spec}"] = (jax.jit(lambda a, b, g, kw=kw: tgmm(a, b, g, **kw)), (x, dy, gs))
      fwd_bwd[f"gmm{spec}"] = lambda a, b, g, kw=kw: jnp.sum(
        gmm(a, b, g, **kw).astype(jnp.float32) * dy.astype(jnp.float32)
      )
    if mosaic_configs and is_hopper():
      paths.update(mosaic_paths(x, w, dy, gs, mosaic_configs))
    elif mosaic_configs:
      print(f"speed {shape}: Mosaic GPU paths skipped (not a Hopper GPU)", flush=True)
    references = {
      "gmm": paths["ragged_dot"][0](x, w, gs),
      "tgmm": jax.jit(jax.grad(fwd_bwd["ragged_dot"], argnums=1))(x, w, gs),
    }
    results, errors = {}, {}
    for name, (jitted, args) in paths.items():
      try:
        results[("fwd", name)] = timed(jitted, *args, reps=reps)
        kind = "tgmm" if "tgmm" in name else "gmm" if "gmm" in name else None
        if kind:
          errors[name] = relative_error(jitted(*args), references[kind])
      except Exception as e:
        print(f"speed {shape} fwd {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    for name, loss in fwd_bwd.items():
      b = dense_w if name == "dense" else w
      try:
        step = jax.jit(jax.grad(loss, argnums=(0, 1)))
        results[("fwd+bwd", name)] = timed(step, x, b, gs, reps=reps)
      except Exception as e:
        print(
          f"speed {shape} fwd+bwd {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True
        )
    for (pass_, name), seconds in sorted(results.items()):
      dense = results.get((pass_, "dense"))
      factor = 3.0 if pass_ == "fwd+bwd" else 1.0
      rec = {
        "part": "speed",
        "shape": shape,
        "dims": [tokens, d, f, experts, top_k],
        "pass": pass_,
        "path": name,
        "median_ms": seconds * 1e3,
        "tflops": factor * flops / seconds / 1e12,
        "dense_over_path": (dense / seconds) if dense else None,
        "rel_err": errors.get(name) if pass_ == "fwd" else None,
      }
      records.append(rec)
      print(json.dumps(rec), flush=True)


def markdown(records) -> str:
  """The device, the correctness part's pass count, worst errors and failures, then
  the speed part's table."""
  lines = [f"# GPU check ({jax.devices()[0].device_kind}, jax {jax.__version__})", ""]
  corr = [r for r in records if r["part"] == "correctness"]
  if corr:
    worst = {
      key: max((r.get(key, 0.0) for r in corr if r["ok"]), default=float("nan"))
      for key in ("gmm_bf16", "tgmm_bf16", "gmm_f32", "tgmm_f32", "grad_f32")
    }
    lines += [
      f"Correctness of the compiled Triton kernels: {sum(r['ok'] for r in corr)}/"
      f"{len(corr)} cases pass. Worst relative error (max|diff|/max|oracle|): "
      + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()),
      "",
    ]
    lines += [f"- FAILED {r['case']}: {r.get('error', r)}" for r in corr if not r["ok"]]
    lines.append("")
  speed = [r for r in records if r["part"] == "speed"]
  if speed:
    lines.append(
      markdown_table(
        [
          "shape (T, d, f, E, k)",
          "pass",
          "path",
          "median ms",
          "TFLOP/s",
          "dense / path",
          "rel. error vs XLA",
        ],
        [
          [
            f"{r['shape']} {tuple(r['dims'])}",
            r["pass"],
            r["path"],
            f"{r['median_ms']:.3f}",
            f"{r['tflops']:.0f}",
            "" if r["dense_over_path"] is None else f"{r['dense_over_path']:.2f}",
            "" if r.get("rel_err") is None else f"{r['rel_err']:.1e}",
          ]
          for r in speed
        ],
      )
    )
  return "\n".join(lines) + "\n"
