"""Differentiable grouped matmul (gmm / tgmm) with per-platform backends.

``gmm`` computes a dropless-MoE expert layer: rows of ``lhs`` are sorted by
expert, group e owns rows [offset_e, offset_e + group_sizes[e]), and
out[rows of e] = lhs[rows of e] @ rhs[e]. ``tgmm`` is its weight gradient,
out[e] = lhs[rows of e]^T @ grad[rows of e]. Both are tied by a custom_vjp
(megablox's gmm/tgmm pairing; SonicMoE uses the same grouped-GEMM split):

  d lhs = gmm(grad, rhs^T)   (rhs read transposed in-kernel, not copied)
  d rhs = tgmm(lhs, grad)
  d group_sizes = None       (integer input)

Backends (``backend=``):
  'auto'        TPU -> Mosaic TPU kernel, GPU -> Triton kernel, CPU -> the
                jnp reference; with interpret=True on CPU -> the TPU-design
                kernel in Pallas interpret mode.
  'reference'   jnp masked-loop reference (gmm_reference.py) everywhere.
  'pallas'      the platform's kernel (TPU-design kernel on CPU, interpreted).
  'pallas_tpu'  the Mosaic TPU kernel (gmm_tpu.py); interpreted off-TPU.
  'pallas_gpu'  the Triton kernel (gmm_gpu.py); interpreted off-GPU.

Only the reference and the interpret-mode kernels were run when this was
written (CPU); the compiled TPU and GPU paths are untested on hardware.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from . import gmm_gpu
from . import gmm_metadata
from . import gmm_tiles
from . import gmm_tpu
from .gmm_reference import gmm_reference, tgmm_reference

BACKENDS = ("auto", "reference", "pallas", "pallas_tpu", "pallas_gpu")
DEFAULT_TILING = (128, 128, 128)
_KERNEL_PLATFORM = {"tpu": "tpu", "gpu": "gpu"}  # kernel flavour -> platform


class _Plan(NamedTuple):
  """Static choice of implementation: kernel in {'reference','tpu','gpu'}.

  ``interpret`` is a bool or a Pallas interpret-params object (for example
  ``pltpu.InterpretParams()``, the TPU-faithful interpreter) handed to
  ``pallas_call`` unchanged.
  """

  kernel: str
  interpret: object
  tiling: tuple[int, int, int]


def _make_plan(backend, interpret, tiling) -> _Plan:
  if backend not in BACKENDS:
    raise ValueError(f"unknown gmm backend {backend!r}; valid backends: {BACKENDS}")
  if (
    not isinstance(tiling, (tuple, list))
    or len(tiling) != 3
    or not all(isinstance(t, int) and t > 0 for t in tiling)
  ):
    raise ValueError(f"tiling must be three positive ints (tm, tk, tn), got {tiling!r}")
  platform = jax.default_backend()
  native = platform if platform in _KERNEL_PLATFORM else None
  if backend == "reference" or (backend == "auto" and native is None and not interpret):
    return _Plan("reference", False, tuple(tiling))
  if backend in ("auto", "pallas"):
    kernel = native or "tpu"
  else:
    kernel = backend.removeprefix("pallas_")
  runs_natively = _KERNEL_PLATFORM[kernel] == platform
  if interpret is None:
    interpret = not runs_natively
  if not interpret and not runs_natively:
    raise ValueError(
      f"backend {backend!r} compiles a {kernel} kernel, but the default "
      f"platform is {platform!r}; pass interpret=True"
    )
  return _Plan(kernel, interpret, tuple(tiling))


def _check_operands(name, lhs, other, group_sizes):
  if lhs.ndim != 2:
    raise ValueError(f"{name}: lhs must be 2-D [m, k], got lhs.shape={lhs.shape}")
  if group_sizes.ndim != 1:
    raise ValueError(
      f"{name}: group_sizes must be 1-D [E], got group_sizes.shape={group_sizes.shape}"
    )
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise ValueError(f"{name}: group_sizes must be integer, got {group_sizes.dtype}")
  if group_sizes.shape[0] < 1:
    raise ValueError(f"{name}: need at least one group, got group_sizes.shape={group_sizes.shape}")
  for operand in (lhs, other):
    if not jnp.issubdtype(operand.dtype, jnp.floating):
      raise ValueError(f"{name}: operands must be floating point, got {operand.dtype}")


def _check_gmm_shapes(lhs, rhs, group_sizes):
  _check_operands("gmm", lhs, rhs, group_sizes)
  if rhs.ndim != 3:
    raise ValueError(f"gmm: rhs must be 3-D [E, k, n], got rhs.shape={rhs.shape}")
  if lhs.shape[1] != rhs.shape[1]:
    raise ValueError(
      f"gmm: contraction dims differ: lhs.shape={lhs.shape} has k={lhs.shape[1]}, "
      f"rhs.shape={rhs.shape} has k={rhs.shape[1]}"
    )
  if group_sizes.shape != (rhs.shape[0],):
    raise ValueError(
      f"gmm: group_sizes.shape={group_sizes.shape} must be ({rhs.shape[0]},) "
      f"to match rhs.shape={rhs.shape}"
    )


def _check_tgmm_shapes(lhs, grad, group_sizes):
  _check_operands("tgmm", lhs, grad, group_sizes)
  if grad.ndim != 2 or grad.shape[0] != lhs.shape[0]:
    raise ValueError(
      f"tgmm: grad must be [m, n] with the rows of lhs: lhs.shape={lhs.shape}, "
      f"grad.shape={grad.shape}"
    )


# --------------------------------------------------------------------------
# Forward dispatch (jitted; everything static is in the plan).


@functools.partial(jax.jit, static_argnames=("plan", "out_dtype", "transpose_rhs"))
def _gmm_forward(lhs, rhs, group_sizes, *, plan, out_dtype, transpose_rhs):
  m, k = lhs.shape
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  if plan.kernel == "reference":
    weights = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    return gmm_reference(lhs, weights, group_sizes, preferred_element_type=out_dtype)
  if 0 in (m, k, n):
    return jnp.zeros((m, n), out_dtype)
  tiling = gmm_tiles.fit_tiling(plan.tiling, m, k, n)
  if plan.kernel == "gpu" and not plan.interpret:
    itemsize = max(lhs.dtype.itemsize, rhs.dtype.itemsize)
    tiling = gmm_gpu.fit_shared_memory(tiling, itemsize, contraction_axis=1)
    gmm_gpu.check_gpu_tiling(tiling)
  m_pad, k_pad, n_pad = (gmm_tiles.round_up(d, t) for d, t in zip((m, k, n), tiling))
  lhs = gmm_tiles.pad_axes(lhs, {0: m_pad, 1: k_pad})
  rhs_axes = {1: n_pad, 2: k_pad} if transpose_rhs else {1: k_pad, 2: n_pad}
  rhs = gmm_tiles.pad_axes(rhs, rhs_axes)
  offsets = gmm_metadata.group_offsets(group_sizes, m)
  kernel = gmm_tpu.gmm_tpu if plan.kernel == "tpu" else gmm_gpu.gmm_gpu
  out = kernel(
    lhs,
    rhs,
    offsets,
    tiling=tiling,
    out_dtype=out_dtype,
    transpose_rhs=transpose_rhs,
    interpret=plan.interpret,
  )
  return out[:m, :n]


@functools.partial(jax.jit, static_argnames=("plan", "out_dtype"))
def _tgmm_forward(lhs, grad, group_sizes, *, plan, out_dtype):
  (m, k), n = lhs.shape, grad.shape[1]
  num_groups = group_sizes.shape[0]
  if plan.kernel == "reference":
    return tgmm_reference(lhs, grad, group_sizes, preferred_element_type=out_dtype)
  if 0 in (m, k, n):
    return jnp.zeros((num_groups, k, n), out_dtype)
  tiling = gmm_tiles.fit_tiling(plan.tiling, m, k, n)
  if plan.kernel == "gpu" and not plan.interpret:
    itemsize = max(lhs.dtype.itemsize, grad.dtype.itemsize)
    tiling = gmm_gpu.fit_shared_memory(tiling, itemsize, contraction_axis=0)
    gmm_gpu.check_gpu_tiling(tiling)
  m_pad, k_pad, n_pad = (gmm_tiles.round_up(d, t) for d, t in zip((m, k, n), tiling))
  lhs = gmm_tiles.pad_axes(lhs, {0: m_pad, 1: k_pad})
  grad = gmm_tiles.pad_axes(grad, {0: m_pad, 1: n_pad})
  offsets = gmm_metadata.group_offsets(group_sizes, m)
  kernel = gmm_tpu.tgmm_tpu if plan.kernel == "tpu" else gmm_gpu.tgmm_gpu
  out = kernel(
    lhs,
    grad,
    offsets,
    num_groups=num_groups,
    tiling=tiling,
    out_dtype=out_dtype,
    interpret=plan.interpret,
  )
  return out[:, :k, :n]


# --------------------------------------------------------------------------
# custom_vjp pair. Cotangents are cast to the operands' dtype before the
# backward matmuls (bf16 operands -> bf16 backward GEMMs, f32 accumulation).


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _gmm(lhs, rhs, group_sizes, plan, out_dtype, transpose_rhs):
  return _gmm_forward(
    lhs, rhs, group_sizes, plan=plan, out_dtype=out_dtype, transpose_rhs=transpose_rhs
  )


def _gmm_fwd(lhs, rhs, group_sizes, plan, out_dtype, transpose_rhs):
  out = _gmm(lhs, rhs, group_sizes, plan, out_dtype, transpose_rhs)
  return out, (lhs, rhs, group_sizes)


def _gmm_bwd(plan, out_dtype, transpose_rhs, residuals, out_grad):
  lhs, rhs, group_sizes = residuals
  out_grad = out_grad.astype(lhs.dtype)
  # out = lhs @ W with W = rhs[e] (or rhs[e]^T): d lhs = g @ W^T.
  d_lhs = _gmm(out_grad, rhs, group_sizes, plan, lhs.dtype, not transpose_rhs)
  # d W = lhs^T g; for transposed rhs, d rhs[e] = g^T lhs = tgmm(g, lhs).
  if transpose_rhs:
    d_rhs = _tgmm(out_grad, lhs, group_sizes, plan, rhs.dtype)
  else:
    d_rhs = _tgmm(lhs, out_grad, group_sizes, plan, rhs.dtype)
  return d_lhs, d_rhs, None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _tgmm(lhs, grad, group_sizes, plan, out_dtype):
  return _tgmm_forward(lhs, grad, group_sizes, plan=plan, out_dtype=out_dtype)


def _tgmm_fwd(lhs, grad, group_sizes, plan, out_dtype):
  return _tgmm(lhs, grad, group_sizes, plan, out_dtype), (lhs, grad, group_sizes)


def _tgmm_bwd(plan, out_dtype, residuals, out_grad):
  lhs, grad, group_sizes = residuals
  out_grad = out_grad.astype(lhs.dtype)
  # out[e] = lhs_e^T grad_e: d lhs_e = grad_e @ C_e^T, d grad_e = lhs_e @ C_e.
  d_lhs = _gmm(grad, out_grad, group_sizes, plan, lhs.dtype, True)
  d_grad = _gmm(lhs, out_grad, group_sizes, plan, grad.dtype, False)
  return d_lhs, d_grad, None


_tgmm.defvjp(_tgmm_fwd, _tgmm_bwd)


# --------------------------------------------------------------------------
# Public API.


def _common_dtype(a, b, preferred):
  dtype = jnp.promote_types(a.dtype, b.dtype)
  return dtype, (dtype if preferred is None else jnp.dtype(preferred))


def gmm(
  lhs,
  rhs,
  group_sizes,
  *,
  preferred_element_type=None,
  tiling=DEFAULT_TILING,
  backend="auto",
  interpret=None,
):
  """Grouped matmul: lhs [m, k], rhs [E, k, n], group_sizes [E] -> [m, n].

  out[rows of group e] = lhs[rows of group e] @ rhs[e], accumulated in
  float32 and cast to ``preferred_element_type`` (default: the promoted input
  dtype). Rows past sum(group_sizes) produce zeros (and get zero gradient);
  groups are clipped at m. Differentiable w.r.t. lhs and rhs; shapes are
  validated before any tracing. ``tiling`` = (tm, tk, tn) is an upper bound:
  tiles shrink to small dims and operands are zero-padded to tile multiples.
  ``backend`` is one of BACKENDS (see module docstring); ``interpret`` is
  None (interpret iff the kernel's platform is not the default one), a bool,
  or a Pallas interpret-params object such as ``pltpu.InterpretParams()``.
  """
  lhs, rhs, group_sizes = map(jnp.asarray, (lhs, rhs, group_sizes))
  _check_gmm_shapes(lhs, rhs, group_sizes)
  plan = _make_plan(backend, interpret, tiling)
  dtype, out_dtype = _common_dtype(lhs, rhs, preferred_element_type)
  return _gmm(
    lhs.astype(dtype), rhs.astype(dtype), group_sizes.astype(jnp.int32), plan, out_dtype, False
  )


def tgmm(
  lhs,
  grad,
  group_sizes,
  *,
  preferred_element_type=None,
  tiling=DEFAULT_TILING,
  backend="auto",
  interpret=None,
):
  """Transposed grouped matmul: lhs [m, k], grad [m, n], group_sizes [E] -> [E, k, n].

  out[e] = lhs[rows of e]^T @ grad[rows of e] (the gmm weight gradient);
  empty groups give zeros, rows past sum(group_sizes) are ignored. Float32
  accumulation; differentiable w.r.t. lhs and grad.
  """
  lhs, grad, group_sizes = map(jnp.asarray, (lhs, grad, group_sizes))
  _check_tgmm_shapes(lhs, grad, group_sizes)
  plan = _make_plan(backend, interpret, tiling)
  dtype, out_dtype = _common_dtype(lhs, grad, preferred_element_type)
  return _tgmm(
    lhs.astype(dtype), grad.astype(dtype), group_sizes.astype(jnp.int32), plan, out_dtype
  )
