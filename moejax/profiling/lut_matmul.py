"""CodeQuant's CPU claim measured here (experiments/benchmarks/lut_matmul.py): one
expert matrix W [d_in, d_out] at a few rows x [B, d_in], computed as

  float32                  x @ W (XLA dot)
  dequantize_then_matmul   4-bit codes, groups of `group` rows: x @ ((c - z) s),
                           the whole matrix dequantized each call (XLA)
  affine_kernel            the same codes through the FFI kernel 'affine'
                           (kernels/cpu_gathered.py: read in place, one pass)
  lut_kernel               4-bit codebook indices, one 16-entry codebook per group
                           (CodeQuant, arXiv 2604.10496): the FFI lookup-table kernel
  lut_bucket_sums          the same codebook by codebook.lut_matmul (XLA: bucket
                           sums per group, then centroids)

each jitted, called with its operands, timed interleaved (medians); ratio = the
float32 time / the arm's. The FFI arms run the rows one after another (each row
reads the codes once more).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moejax.evaluation.stats import markdown_table
from moejax.experts import codebook, quantized
from moejax.kernels import cpu_gathered
from moejax.profiling.timing import calls_per_round, interleaved_times, medians

BITS = 4
SHAPES = {"qwen3_moe_bench": (256, 256), "qwen3_30b_a3b": (2048, 768)}


def arms(d_in: int, d_out: int, batch: int, group: int, seed: int = 0) -> dict:
  """{arm: (jitted fn, operands)} of the module doc for x [batch, d_in]."""
  rng = np.random.default_rng(seed)
  w = (rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(np.float32)
  x = jnp.asarray(rng.standard_normal((batch, d_in)), jnp.float32)
  codes, scales, zeros = quantized.rtn(jnp.asarray(w), BITS, group, symmetric=False)
  indices, centroids = codebook.quantile_codebook(jnp.asarray(w), BITS, group)
  first = jnp.zeros((batch,), jnp.int32)  # every row through expert 0 of one

  def affine(x, c, s, z):
    return cpu_gathered.gathered_matmul("affine", x, c[None], (s[None], z[None]), first)

  def lut(x, i, c):
    return cpu_gathered.gathered_matmul("lookup", x, i[None], (c[None],), first)

  out: dict[str, tuple[Any, tuple]] = {
    "float32": (jnp.matmul, (x, jnp.asarray(w))),
    "dequantize_then_matmul": (
      lambda x, c, s, z: x @ quantized.dequantize(c, s, z),
      (x, codes, scales, zeros),
    ),
    "lut_bucket_sums": (
      lambda x, i, c: codebook.lut_matmul(x, i, c, group),
      (x, indices, centroids),
    ),
  }
  if cpu_gathered.built():
    out["affine_kernel"] = (affine, (x, codes, scales.astype(jnp.float32), zeros))
    out["lut_kernel"] = (lut, (x, indices, centroids))
  return {name: (jax.jit(fn), args) for name, (fn, args) in out.items()}


def shape_rows(name: str, d_in: int, d_out: int, batches, group: int, reps: int) -> list:
  """Per batch and arm: ms per call (median of `reps` interleaved rounds), the
  ratio to float32 and the largest error against float32's output relative to it."""
  rows = []
  for batch in batches:
    fns = arms(d_in, d_out, batch, group)
    want = np.asarray(fns["float32"][0](*fns["float32"][1]))
    calls = {}
    for arm, (fn, args) in fns.items():
      calls[arm] = lambda fn=fn, args=args: fn(*args)
      calls[arm]()  # compile
    inner = {arm: calls_per_round(fn, 0.02, 2000) for arm, fn in calls.items()}
    times = medians(interleaved_times(calls, reps, inner))
    for arm, (fn, args) in fns.items():
      got = np.asarray(fn(*args))
      rows.append(
        {
          "shape": name,
          "d_in": d_in,
          "d_out": d_out,
          "batch": batch,
          "arm": arm,
          "ms": 1e3 * times[arm],
          "ratio": times["float32"] / times[arm],
          "error_vs_float32": float(np.max(np.abs(got - want)) / np.max(np.abs(want))),
        }
      )
  return rows


def table(rows) -> str:
  header = ["shape", "d_in x d_out", "batch", "arm", "ms", "float32 / arm", "max error / max y"]
  return markdown_table(
    header,
    [
      [
        r["shape"],
        f"{r['d_in']} x {r['d_out']}",
        r["batch"],
        r["arm"],
        f"{r['ms']:.4f}",
        f"{r['ratio']:.2f}x",
        f"{r['error_vs_float32']:.3f}",
      ]
      for r in rows
    ],
  )
