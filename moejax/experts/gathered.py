"""Compressed experts on a few rows (a decode step): each row through its own
expert, reading only those experts' codes, dequantized where they are consumed.

The 'gather' grouped matmul (moejax/dispatch/token_gather.py) sends each (token,
slot) assignment as its own row r with its expert row_expert[r]; an expert type's
`gathered(weights, rows, row_expert, **options)` (experts/base.py) computes the
type's expert function on them. For the compressed types (quantized.py,
codebook.py) every SwiGLU matmul is

    y[r] = x[r] @ W_hat[row_expert[r]]                              (`rows_matmul`)

by one of two kernels, chosen by the type's setting `decode_kernel`:

  'xla'   the type's `dense_rows`: the rows' experts' codes gathered, then
          dequantized and multiplied (XLA fuses the gather with the dequantization;
          the dequantized slices, R x d_in x d_out floats, are its temporaries);
  'ffi'   the XLA:CPU FFI kernels (kernels/cpu_gathered.py): the stored uint8 codes
          read in place, dequantized inside the multiply-add loop; the gradients
          are the 'xla' form's (a custom_vjp), the forward equal to it up to
          float32 summation order for integer codes in [0, 256);
  'auto'  'ffi' on CPU when the kernels are built, else 'xla' (a warning once
          when on CPU they are not).

Codes travel in the weights dict as exact floats (experts/compressed.py); the
FFI call converts them back to uint8, a pair of converts XLA removes, so the
call reads the stored uint8 array itself.
"""

from __future__ import annotations

import functools

import jax

from moejax.errors import ConfigError, choice_error
from moejax.experts.compressed import MATRICES
from moejax.experts.swiglu import swiglu_experts
from moejax.kernels import cpu_gathered

DECODE_KERNELS = ("auto", "ffi", "xla")


def check_decode_kernel(key: str, value) -> None:
  """ConfigError naming `key` unless value is one of DECODE_KERNELS, or for 'ffi'
  when the kernels are not built (saying how to build them)."""
  if value not in DECODE_KERNELS:
    raise choice_error(key, value, DECODE_KERNELS)
  if value == "ffi" and not cpu_gathered.built():
    raise ConfigError(f"{key}='ffi': {cpu_gathered.MISSING}")


def uses_ffi(decode_kernel: str) -> bool:
  """Whether `decode_kernel` runs the FFI kernels here (module doc)."""
  if decode_kernel == "xla":
    return False
  on_cpu = jax.default_backend() == "cpu"
  if decode_kernel == "ffi":
    check_decode_kernel("decode_kernel", decode_kernel)
    if not on_cpu:
      raise ConfigError(
        f"decode_kernel='ffi' is an XLA:CPU kernel; the backend is {jax.default_backend()!r} "
        "(use 'auto' or 'xla')"
      )
    return True
  if not on_cpu:
    return False
  if not cpu_gathered.built():
    cpu_gathered.warn_missing()
    return False
  return True


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _ffi_rows(kernel, dense_rows, x, row_expert, codes, params):
  return cpu_gathered.gathered_matmul(kernel, x, codes, params, row_expert).astype(x.dtype)


def _ffi_rows_fwd(kernel, dense_rows, x, row_expert, codes, params):
  return _ffi_rows(kernel, dense_rows, x, row_expert, codes, params), (x, row_expert, codes, params)


def _ffi_rows_bwd(kernel, dense_rows, residuals, grad):
  x, row_expert, codes, params = residuals
  _, vjp = jax.vjp(lambda x, c, p: dense_rows(x, row_expert, c, *p), x, codes, params)
  dx, dcodes, dparams = vjp(grad)
  return dx, None, dcodes, dparams


_ffi_rows.defvjp(_ffi_rows_fwd, _ffi_rows_bwd)


def rows_matmul(kernel: str, dense_rows, x, row_expert, codes, params, decode_kernel: str):
  """y[r] = x[r] @ W_hat[row_expert[r]], [R, d_out] in x's dtype. kernel: the FFI
  kernel of this code form ('affine', 'lookup'); dense_rows(x, row_expert, codes,
  *params): the type's XLA form (module doc); codes float [E, d_in, d_out]."""
  if uses_ffi(decode_kernel):
    return _ffi_rows(kernel, dense_rows, x, row_expert, codes, tuple(params))
  return dense_rows(x, row_expert, codes, *params)


def swiglu_rows(weights, rows, row_expert, kernel, parts, dense_rows, decode_kernel, prepare=None):
  """The SwiGLU expert on rows [R, d], row r through expert row_expert[r]: each of
  its matmuls `rows_matmul` of the weights <matrix>_<part> for `parts` (the codes
  first), its input v replaced by prepare(v, matrix) first when given (the
  codebook types' rotation, activation fake-quantization)."""

  def project(v, matrix):
    v = v if prepare is None else prepare(v, matrix)
    params = [weights[f"{matrix}_{part}"] for part in parts]
    return rows_matmul(kernel, dense_rows, v, row_expert, params[0], params[1:], decode_kernel)

  return swiglu_experts({m: m for m in MATRICES}, rows, project)
