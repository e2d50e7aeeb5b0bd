"""Gradients through the gmm/tgmm custom_vjp versus autodiff of dense formulations.

The expected gradients come from jax.grad of a one-hot einsum
(``dense_gmm``), which shares no code with the kernels, the metadata or the
jnp reference. float32: rtol = atol = 1e-5 (same reasoning as the forward
tests). bfloat16 operands: compared against f32 autodiff of the same
bf16-valued inputs with rtol = 2e-2 and atol = 2e-2 * max|expected|: the
forward output and the incoming cotangent are each rounded to bf16 once
(unit roundoff 2**-9) and the gradient once more; the absolute part covers
entries that are sums with cancellation and hence near zero.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gmm_test_oracles import dense_gmm, make_case, ragged_layouts, row_one_hot
from moejax.kernels import gmm, tgmm

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

F32_TOL = dict(rtol=1e-5, atol=1e-5)
BACKENDS = ["reference", "pallas_tpu", "pallas_gpu"]
TILING = (8, 8, 8)


def kernel_grads(case, backend, dtype=jnp.float32):
  lhs, rhs = jnp.asarray(case.lhs, dtype), jnp.asarray(case.rhs, dtype)

  def loss(lhs, rhs):
    out = gmm(lhs, rhs, case.group_sizes, tiling=TILING, backend=backend, interpret=True)
    return jnp.sum(out.astype(jnp.float32) * case.grad)

  return jax.grad(loss, argnums=(0, 1))(lhs, rhs)


def dense_grads(case, dtype=jnp.float32):
  """f32 autodiff of the one-hot formulation at the (dtype-rounded) inputs."""
  lhs, rhs = (jnp.asarray(x, dtype).astype(jnp.float32) for x in (case.lhs, case.rhs))
  one_hot = row_one_hot(case.group_sizes, case.m)

  def loss(lhs, rhs):
    return jnp.sum(dense_gmm(lhs, rhs, one_hot) * case.grad)

  return jax.grad(loss, argnums=(0, 1))(lhs, rhs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", [([5, 0, 13, 12], 40), ([0, 37], 37), ([0, 0], 9)])
def test_grads_match_dense_autodiff_f32(backend, layout):
  sizes, m = layout
  case = make_case(sizes, m, k=20, n=12)
  d_lhs, d_rhs = kernel_grads(case, backend)
  want_lhs, want_rhs = dense_grads(case)
  np.testing.assert_allclose(d_lhs, want_lhs, **F32_TOL)
  np.testing.assert_allclose(d_rhs, want_rhs, **F32_TOL)
  total = sum(sizes)
  assert np.all(np.asarray(d_lhs)[total:] == 0), "padding rows must get zero gradient"


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
@settings(max_examples=3, deadline=None)  # each new shape compiles (suite budget)
@given(
  layout=ragged_layouts(max_groups=8, max_rows=40),
  k=st.sampled_from([8, 16]),
  n=st.sampled_from([8, 16]),
)
def test_grads_on_random_ragged_layouts(backend, layout, k, n):
  sizes, m = layout
  case = make_case(sizes, m, k, n, seed=m)
  d_lhs, d_rhs = kernel_grads(case, backend)
  want_lhs, want_rhs = dense_grads(case)
  np.testing.assert_allclose(d_lhs, want_lhs, **F32_TOL)
  np.testing.assert_allclose(d_rhs, want_rhs, **F32_TOL)
  assert np.all(np.asarray(d_lhs)[sum(sizes) :] == 0)


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
def test_grads_bf16(backend):
  case = make_case([5, 0, 13, 12], 40, k=16, n=16)
  got = kernel_grads(case, backend, jnp.bfloat16)
  want = dense_grads(case, jnp.bfloat16)
  for g, w in zip(got, want):
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(
      g.astype(jnp.float32), w, rtol=2e-2, atol=2e-2 * float(jnp.max(jnp.abs(w)))
    )


@pytest.mark.parametrize("backend", ["reference", "pallas_tpu", "pallas_gpu"])
def test_tgmm_grads_match_dense_autodiff(backend):
  """tgmm has its own custom_vjp (so gmm is twice differentiable)."""
  case = make_case([3, 0, 9, 6], 21, k=8, n=16)
  one_hot = row_one_hot(case.group_sizes, case.m)
  cot = np.random.default_rng(1).standard_normal((4, 8, 16)).astype(np.float32)

  def loss(lhs, grad):
    w = tgmm(lhs, grad, case.group_sizes, tiling=TILING, backend=backend, interpret=True)
    return jnp.sum(w * cot)

  def dense_loss(lhs, grad):
    w = jnp.einsum("mk,mn,me->ekn", lhs, grad, one_hot, precision="highest")
    return jnp.sum(w * cot)

  got = jax.grad(loss, argnums=(0, 1))(case.lhs, case.grad)
  want = jax.grad(dense_loss, argnums=(0, 1))(case.lhs, case.grad)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, **F32_TOL)


def test_group_sizes_get_float0_cotangent():
  case = make_case([3, 5], 8, 8, 8)
  _, vjp = jax.vjp(
    lambda left, r, s: gmm(left, r, s, backend="pallas_tpu", tiling=TILING),
    case.lhs,
    case.rhs,
    case.group_sizes,
  )
  _, _, d_sizes = vjp(jnp.ones((8, 8), jnp.float32))
  assert d_sizes.dtype == jax.dtypes.float0 and d_sizes.shape == (2,)


def test_jitted_moe_mlp_grads_match_reference():
  """Two gmm layers with a nonlinearity, jitted value_and_grad, group sizes as
  traced data: the interpret kernels agree with the reference backend."""
  rng = np.random.default_rng(2)
  m, d, h, num_experts = 24, 16, 32, 3
  x = rng.standard_normal((m, d)).astype(np.float32)
  params = {
    "w_in": rng.standard_normal((num_experts, d, h)).astype(np.float32) / 4,
    "w_out": rng.standard_normal((num_experts, h, d)).astype(np.float32) / 4,
  }
  sizes = jnp.array([7, 0, 14], jnp.int32)  # 3 padding rows

  def make_loss(backend):
    def loss(params, x, sizes):
      def layer(a, w):
        return gmm(a, w, sizes, tiling=TILING, backend=backend, interpret=True)

      y = layer(jax.nn.gelu(layer(x, params["w_in"])), params["w_out"])
      return jnp.mean(y**2)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

  (v_ref, g_ref) = make_loss("reference")(params, x, sizes)
  for backend in ("pallas_tpu", "pallas_gpu"):
    v, g = make_loss(backend)(params, x, sizes)
    np.testing.assert_allclose(v, v_ref, **F32_TOL)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **F32_TOL), g, g_ref)
