"""Pure-jnp grouped matmul references: the test oracle and the CPU fallback.

Deliberately the "obviously right" masked-loop formulation: scan over groups,
zero every row outside the group, and do a dense matmul. Costs E times the
FLOPs of a kernel, but has no tiling, padding or metadata to get wrong, and is
differentiable by plain autodiff. Rows past ``sum(group_sizes)`` (or past m)
belong to no group and therefore produce zeros.
"""

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


def _out_dtype(preferred, a, b):
  return jnp.result_type(a, b) if preferred is None else jnp.dtype(preferred)


def _group_bounds(group_sizes):
  ends = jnp.cumsum(group_sizes.astype(jnp.int32))
  return ends - group_sizes.astype(jnp.int32), ends


def gmm_reference(lhs, rhs, group_sizes, *, preferred_element_type=None):
  """out[m, n]: rows of group e are lhs[rows] @ rhs[e]; other rows are 0."""
  out_dtype = _out_dtype(preferred_element_type, lhs, rhs)
  rows = jnp.arange(lhs.shape[0])[:, None]
  starts, ends = _group_bounds(group_sizes)

  def add_group(acc, group):
    weights, start, end = group
    x = jnp.where((rows >= start) & (rows < end), lhs, 0)
    return acc + jnp.dot(x, weights, precision=_HIGHEST, preferred_element_type=jnp.float32), None

  init = jnp.zeros((lhs.shape[0], rhs.shape[2]), jnp.float32)
  out, _ = jax.lax.scan(add_group, init, (rhs, starts, ends))
  return out.astype(out_dtype)


def tgmm_reference(lhs, grad, group_sizes, *, preferred_element_type=None):
  """out[E, k, n]: out[e] = lhs[rows of e]^T @ grad[rows of e]; empty -> 0."""
  out_dtype = _out_dtype(preferred_element_type, lhs, grad)
  rows = jnp.arange(lhs.shape[0])[:, None]
  starts, ends = _group_bounds(group_sizes)

  def group_product(_, bounds):
    start, end = bounds
    x = jnp.where((rows >= start) & (rows < end), lhs, 0)
    return None, jnp.dot(x.T, grad, precision=_HIGHEST, preferred_element_type=jnp.float32)

  _, out = jax.lax.scan(group_product, None, (starts, ends))
  return out.astype(out_dtype)
