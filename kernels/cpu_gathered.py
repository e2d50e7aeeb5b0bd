"""XLA:CPU FFI kernels for compressed experts at decode (kernels/cpu/gathered_matmul.cc).

Each kernel computes y[r] = x[r] @ W_hat[row_expert[r]] for a few rows, reading the
rows' experts' stored uint8 codes in place and dequantizing where they are consumed
(no float copy of any weight matrix):

  'affine'  codes, scales [E, G, d_out] float32, zero points [E, G, d_out] uint8:
            W_hat[i, j] = (code - zero) * scale of row i's group (experts/quantized.py)
  'lookup'  indices, centroids [E, G, K]: W_hat[i, j] = centroids[g(i), index]
            (experts/codebook.py), a lookup-table matmul

x float32 [R, d_in], codes [E, d_in, d_out] uint8, row_expert int32 [R] in [0, E).
scripts/build_cpu_kernels.sh (run by scripts/setup.sh) builds the library with g++;
`built()` says whether it is there (and registers the targets once). Forward only:
callers differentiate through their XLA reference (moejax/experts/gathered.py).
"""

import ctypes
import functools
import os
import warnings

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
LIBRARY = os.path.join(ROOT, "build", "cpu_kernels", "libmoejax_cpu.so")
TARGETS = {
  "affine": ("moejax_gathered_affine_matmul", "MoejaxGatheredAffineMatmul"),
  "lookup": ("moejax_gathered_lookup_matmul", "MoejaxGatheredLookupMatmul"),
}
MISSING = (
  f"the CPU decode kernels are not built ({LIBRARY} is missing): run "
  "bash scripts/build_cpu_kernels.sh (needs g++: apt-get install g++)"
)


@functools.cache
def built() -> bool:
  """Whether the library exists; loads it and registers its targets the first time."""
  if not os.path.exists(LIBRARY):
    return False
  library = ctypes.cdll.LoadLibrary(LIBRARY)
  for target, symbol in TARGETS.values():
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), "cpu")
  return True


@functools.cache
def warn_missing() -> None:
  """Warns, once per process, that compressed experts decode through XLA instead."""
  warnings.warn(f"{MISSING}; compressed experts decode through XLA", stacklevel=3)


def gathered_matmul(kernel: str, x, codes, params, row_expert):
  """y [R, d_out] float32 of `kernel` ('affine' or 'lookup', module doc) on x [R, d_in],
  codes uint8 [E, d_in, d_out], params (scales, zeros) or (centroids,), row_expert [R]."""
  if not built():
    raise RuntimeError(MISSING)
  out = jax.ShapeDtypeStruct((x.shape[0], codes.shape[-1]), jnp.float32)
  call = jax.ffi.ffi_call(TARGETS[kernel][0], out, vmap_method="sequential")
  if kernel == "affine":  # scales float32, zero points uint8 (read in place too)
    params = (params[0].astype(jnp.float32), params[1].astype(jnp.uint8))
  else:
    params = tuple(p.astype(jnp.float32) for p in params)
  return call(x.astype(jnp.float32), codes.astype(jnp.uint8), *params, row_expert.astype(jnp.int32))
