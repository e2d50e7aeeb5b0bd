"""Pallas kernels (interpret mode on CPU) against the jnp reference and numpy.

Both kernel designs are exercised: the Mosaic-TPU one (sequential work-item
grid, megablox-style metadata) and the Triton-GPU one (per-program loops).

Tolerances:
* float32: rtol = atol = 1e-5. Kernel and reference both accumulate in float32
  and differ only in summation order (k tiles), a few ulps of values ~sqrt(k).
* bfloat16 in and out: rtol = 2**-7. Products of bf16 values are exact in
  float32, so the only difference is f32 summation order followed by one
  rounding to bf16 (8 significant bits); a value on a rounding boundary may
  land one bf16 ulp (<= 2**-7 relative) away.
* bfloat16 in, float32 out: 1e-5 against the float64 oracle of the same bf16
  values -- this fails if a kernel accumulates in bf16.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.experimental.pallas import tpu as pltpu

from gmm_test_oracles import EDGE_LAYOUTS, make_case, numpy_gmm, numpy_tgmm, ragged_layouts
from moejax.kernels import gmm, gmm_reference, tgmm, tgmm_reference

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

F32_TOL = dict(rtol=1e-5, atol=1e-5)
BF16_TOL = dict(rtol=2.0**-7, atol=1e-5)
KERNELS = ["pallas_tpu", "pallas_gpu"]

LAYOUTS = EDGE_LAYOUTS


def run_both(case, backend, tiling, dtype=jnp.float32, out_dtype=None, interpret=True):
  lhs, rhs, grad = (jnp.asarray(x, dtype) for x in (case.lhs, case.rhs, case.grad))
  kwargs = dict(
    preferred_element_type=out_dtype, tiling=tiling, backend=backend, interpret=interpret
  )
  return (gmm(lhs, rhs, case.group_sizes, **kwargs), tgmm(lhs, grad, case.group_sizes, **kwargs))


@pytest.mark.parametrize("backend", KERNELS)
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_kernel_matches_reference_f32(backend, layout):
  sizes, m = layout
  case = make_case(sizes, m, k=20, n=12)  # k, n not tile multiples either
  out, wgrad = run_both(case, backend, tiling=(8, 8, 8))
  np.testing.assert_allclose(out, gmm_reference(case.lhs, case.rhs, case.group_sizes), **F32_TOL)
  np.testing.assert_allclose(
    wgrad, tgmm_reference(case.lhs, case.grad, case.group_sizes), **F32_TOL
  )
  total = min(sum(sizes), m)
  assert np.all(np.asarray(out)[total:] == 0), "padding rows must be exactly zero"
  for e in np.flatnonzero(np.asarray(sizes) == 0):
    assert np.all(np.asarray(wgrad)[e] == 0), "empty groups must give zero weights"


FAITHFUL_LAYOUTS = [
  "mid_tile_bounds_empty_group_padding_tile",
  "all_groups_empty",
  "eight_groups_in_few_tiles",
  "m_smaller_than_tile",
]


@pytest.mark.parametrize(
  "layout", [LAYOUTS[name] for name in FAITHFUL_LAYOUTS], ids=FAITHFUL_LAYOUTS
)
def test_tpu_kernel_under_tpu_faithful_interpreter(layout):
  """pltpu.InterpretParams fills fresh buffers with NaN and simulates TPU
  pipelining, so reading an unwritten accumulator/output block would show."""
  sizes, m = layout
  case = make_case(sizes, m, k=16, n=16)
  params = pltpu.InterpretParams(uninitialized_memory="nan")
  out, wgrad = run_both(case, "pallas_tpu", tiling=(8, 8, 8), interpret=params)
  np.testing.assert_allclose(out, numpy_gmm(case.lhs, case.rhs, sizes), **F32_TOL)
  np.testing.assert_allclose(wgrad, numpy_tgmm(case.lhs, case.grad, sizes), **F32_TOL)


@pytest.mark.parametrize("backend", KERNELS)
def test_kernel_bf16(backend):
  sizes, m = LAYOUTS["mid_tile_bounds_empty_group_padding_tile"]
  case = make_case(sizes, m, k=32, n=16)
  out, wgrad = run_both(case, backend, tiling=(8, 16, 8), dtype=jnp.bfloat16)
  assert out.dtype == wgrad.dtype == jnp.bfloat16
  lhs, rhs, grad = (jnp.asarray(x, jnp.bfloat16) for x in (case.lhs, case.rhs, case.grad))
  np.testing.assert_allclose(
    out.astype(np.float32), gmm_reference(lhs, rhs, case.group_sizes).astype(np.float32), **BF16_TOL
  )
  np.testing.assert_allclose(
    wgrad.astype(np.float32),
    tgmm_reference(lhs, grad, case.group_sizes).astype(np.float32),
    **BF16_TOL,
  )

  # bf16 operands, f32 output: must equal an exact-accumulation oracle.
  out32, wgrad32 = run_both(
    case, backend, tiling=(8, 16, 8), dtype=jnp.bfloat16, out_dtype=jnp.float32
  )
  assert out32.dtype == wgrad32.dtype == jnp.float32

  def as_f32(x):
    return np.asarray(x.astype(jnp.float32))

  np.testing.assert_allclose(out32, numpy_gmm(as_f32(lhs), as_f32(rhs), sizes), **F32_TOL)
  np.testing.assert_allclose(wgrad32, numpy_tgmm(as_f32(lhs), as_f32(grad), sizes), **F32_TOL)


@pytest.mark.parametrize("backend", KERNELS)
@settings(max_examples=5, deadline=None)  # each new shape compiles (suite budget)
@given(
  layout=ragged_layouts(),
  k=st.sampled_from([8, 16, 32]),
  n=st.sampled_from([8, 16, 32]),
  tiling=st.tuples(st.sampled_from([8, 16]), st.sampled_from([8, 16]), st.sampled_from([8, 16])),
)
def test_kernel_matches_numpy_on_random_ragged_layouts(backend, layout, k, n, tiling):
  sizes, m = layout
  case = make_case(sizes, m, k, n, seed=len(sizes))
  out, wgrad = run_both(case, backend, tiling)
  np.testing.assert_allclose(out, numpy_gmm(case.lhs, case.rhs, sizes), **F32_TOL)
  np.testing.assert_allclose(wgrad, numpy_tgmm(case.lhs, case.grad, sizes), **F32_TOL)
