"""Independent oracles and case builders for the grouped-matmul tests.

Nothing here imports ``kernels``: the oracles are written from the definition
(numpy float64 loops over explicit row slices, and a one-hot einsum whose
jax.grad gives the reference gradients).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

HIGHEST = jax.lax.Precision.HIGHEST

# (group_sizes, m): what each layout exercises is in the id (also run compiled on a
# GPU by experiments/benchmarks/gpu_check.py).
EDGE_LAYOUTS = {
  "aligned": ([16, 16], 32),
  "mid_tile_bounds_empty_group_padding_tile": ([5, 0, 13, 12], 40),
  "all_groups_empty": ([0, 0, 0], 20),
  "m_not_tile_multiple_leading_empty": ([0, 37], 37),
  "single_group": ([37], 37),
  "eight_groups_in_few_tiles": ([3, 1, 1, 2, 0, 9, 4, 1], 29),
  "m_smaller_than_tile": ([0, 7, 0], 7),
  "groups_overflow_m_are_clipped": ([5, 10], 8),
}


def numpy_gmm(lhs, rhs, group_sizes):
  """float64 out[m, n], one explicit row slice per group; other rows zero."""
  lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
  out = np.zeros((lhs.shape[0], rhs.shape[2]))
  start = 0
  for e, size in enumerate(np.asarray(group_sizes)):
    end = min(start + int(size), lhs.shape[0])
    out[start:end] = lhs[start:end] @ rhs[e]
    start = end
  return out


def numpy_tgmm(lhs, grad, group_sizes):
  """float64 out[E, k, n] = lhs[rows of e].T @ grad[rows of e]."""
  lhs, grad = np.asarray(lhs, np.float64), np.asarray(grad, np.float64)
  sizes = np.asarray(group_sizes)
  out = np.zeros((len(sizes), lhs.shape[1], grad.shape[1]))
  start = 0
  for e, size in enumerate(sizes):
    end = min(start + int(size), lhs.shape[0])
    out[e] = lhs[start:end].T @ grad[start:end]
    start = end
  return out


def row_one_hot(group_sizes, m):
  """[m, E] float32: row r -> one-hot of its group; padding rows all zero."""
  sizes = np.asarray(group_sizes)
  group_of_row = np.searchsorted(np.cumsum(sizes), np.arange(m), side="right")
  return jax.nn.one_hot(group_of_row, len(sizes), dtype=jnp.float32)


def dense_gmm(lhs, rhs, one_hot):
  """Differentiable dense per-group formulation: sum_e onehot[:, e] * lhs @ rhs[e]."""
  return jnp.einsum(
    "mk,ekn,me->mn", lhs.astype(jnp.float32), rhs.astype(jnp.float32), one_hot, precision=HIGHEST
  )


@dataclasses.dataclass
class Case:
  lhs: np.ndarray
  rhs: np.ndarray
  grad: np.ndarray
  group_sizes: np.ndarray

  @property
  def m(self):
    return self.lhs.shape[0]


def make_case(group_sizes, m, k, n, seed=0):
  """Random float32 operands for a given ragged layout (sum(sizes) <= m)."""
  rng = np.random.default_rng(seed)
  num_groups = len(group_sizes)
  return Case(
    lhs=rng.standard_normal((m, k)).astype(np.float32),
    rhs=rng.standard_normal((num_groups, k, n)).astype(np.float32),
    grad=rng.standard_normal((m, n)).astype(np.float32),
    group_sizes=np.asarray(group_sizes, np.int32),
  )


@st.composite
def ragged_layouts(draw, max_groups=8, max_rows=48):
  """(group_sizes, m): E in 1..max_groups, sizes >= 0 with zeros favoured,
  sum(sizes) <= m, and m - sum(sizes) padding rows (often > 0)."""
  num_groups = draw(st.integers(1, max_groups))
  sizes = draw(
    st.lists(st.one_of(st.just(0), st.integers(0, 20)), min_size=num_groups, max_size=num_groups)
  )
  total = sum(sizes)
  if total > max_rows:  # shrink proportionally to keep interpret runs small
    sizes = [s * max_rows // total for s in sizes]
    total = sum(sizes)
  padding = draw(st.one_of(st.just(0), st.integers(0, 20)))
  m = max(total + padding, 1)
  return sizes, m
