"""The jnp references against independent oracles (numpy loops, lax.ragged_dot)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gmm_test_oracles import make_case, numpy_gmm, numpy_tgmm, ragged_layouts
from moejax.kernels import gmm_reference, tgmm_reference

F32_TOL = dict(rtol=1e-5, atol=1e-5)


@settings(max_examples=12, deadline=None)  # each new shape compiles (suite budget)
@given(ragged_layouts(), st.sampled_from([8, 16, 32]), st.sampled_from([8, 16, 32]))
def test_reference_matches_numpy_loops(layout, k, n):
  sizes, m = layout
  case = make_case(sizes, m, k, n)
  out = gmm_reference(case.lhs, case.rhs, case.group_sizes)
  np.testing.assert_allclose(out, numpy_gmm(case.lhs, case.rhs, sizes), **F32_TOL)
  wgrad = tgmm_reference(case.lhs, case.grad, case.group_sizes)
  np.testing.assert_allclose(wgrad, numpy_tgmm(case.lhs, case.grad, sizes), **F32_TOL)


def test_reference_matches_lax_ragged_dot():
  case = make_case([5, 0, 11, 16], 32, 16, 8)  # ragged_dot needs sum == m
  expected = jax.lax.ragged_dot(
    case.lhs, case.rhs, case.group_sizes, precision=jax.lax.Precision.HIGHEST
  )
  np.testing.assert_allclose(
    gmm_reference(case.lhs, case.rhs, case.group_sizes), expected, **F32_TOL
  )


def test_reference_rows_past_groups_are_zero_and_overflow_is_clipped():
  case = make_case([3, 0, 4], 12, 8, 8)
  out = np.asarray(gmm_reference(case.lhs, case.rhs, case.group_sizes))
  assert np.all(out[7:] == 0) and np.any(out[:7] != 0)
  # Groups running past m are truncated at m, as in the numpy loop.
  sizes = np.array([5, 10], np.int32)
  case = make_case(sizes, 8, 8, 8)
  np.testing.assert_allclose(
    gmm_reference(case.lhs, case.rhs, sizes), numpy_gmm(case.lhs, case.rhs, sizes), **F32_TOL
  )
  np.testing.assert_allclose(
    tgmm_reference(case.lhs, case.grad, sizes), numpy_tgmm(case.lhs, case.grad, sizes), **F32_TOL
  )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_reference_output_dtype(dtype):
  case = make_case([4, 4], 8, 8, 8)
  lhs, rhs = jnp.asarray(case.lhs, dtype), jnp.asarray(case.rhs, dtype)
  assert gmm_reference(lhs, rhs, case.group_sizes).dtype == dtype
  out = gmm_reference(lhs, rhs, case.group_sizes, preferred_element_type=jnp.float32)
  assert out.dtype == jnp.float32
