"""Bad inputs fail early with messages that name the offending values."""

import re

import jax
import jax.numpy as jnp
import pytest

from moejax.kernels import BACKENDS, gmm, tgmm
from moejax.kernels import grouped_matmul

LHS = jnp.zeros((12, 8), jnp.float32)
RHS = jnp.zeros((3, 8, 16), jnp.float32)
SIZES = jnp.array([4, 4, 4], jnp.int32)


def test_contraction_mismatch_names_both_shapes():
  with pytest.raises(ValueError, match=r"lhs.shape=\(12, 8\).*rhs.shape=\(3, 6, 16\)"):
    gmm(LHS, jnp.zeros((3, 6, 16)), SIZES)


def test_group_count_mismatch_names_both_shapes():
  with pytest.raises(
    ValueError, match=r"group_sizes.shape=\(2,\) must be \(3,\).*rhs.shape=\(3, 8, 16\)"
  ):
    gmm(LHS, RHS, jnp.array([6, 6], jnp.int32))


@pytest.mark.parametrize("call", [gmm, lambda *a, **kw: tgmm(LHS, LHS, SIZES, **kw)])
def test_unknown_backend_lists_valid_ones(call):
  with pytest.raises(ValueError, match="'cuda'") as err:
    call(LHS, RHS, SIZES, backend="cuda")
  for name in BACKENDS:
    assert repr(name) in str(err.value)


@pytest.mark.parametrize(
  "lhs, rhs, sizes, pattern",
  [
    (jnp.zeros((12,)), RHS, SIZES, r"lhs must be 2-D.*\(12,\)"),
    (LHS, jnp.zeros((8, 16)), SIZES, r"rhs must be 3-D.*\(8, 16\)"),
    (LHS, RHS, jnp.zeros((3,), jnp.float32), "group_sizes must be integer"),
    (LHS, RHS, jnp.zeros((3, 1), jnp.int32), r"group_sizes must be 1-D.*\(3, 1\)"),
    (LHS.astype(jnp.int32), RHS, SIZES, "floating point"),
  ],
)
def test_gmm_rejects_malformed_operands(lhs, rhs, sizes, pattern):
  with pytest.raises(ValueError, match=pattern):
    gmm(lhs, rhs, sizes)


def test_tgmm_row_mismatch_names_both_shapes():
  with pytest.raises(ValueError, match=r"lhs.shape=\(12, 8\).*grad.shape=\(10, 16\)"):
    tgmm(LHS, jnp.zeros((10, 16)), SIZES)


@pytest.mark.parametrize("tiling", [(8, 8), (8, 0, 8), "888", (8.0, 8, 8)])
def test_bad_tiling(tiling):
  with pytest.raises(ValueError, match=re.escape(f"got {tiling!r}")):
    gmm(LHS, RHS, SIZES, tiling=tiling)


def test_shape_errors_raise_before_tracing_the_kernel(monkeypatch):
  """Validation happens in Python on static shapes, also under jit."""

  def must_not_run(*args, **kwargs):
    raise AssertionError("kernel was traced")

  monkeypatch.setattr(grouped_matmul.gmm_tpu, "gmm_tpu", must_not_run)
  with pytest.raises(ValueError, match="contraction dims differ"):
    jax.jit(lambda a, r: gmm(a, r, SIZES, backend="pallas_tpu"))(LHS, jnp.zeros((3, 6, 16)))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU-only expectation")
def test_compiled_kernel_on_cpu_is_refused():
  with pytest.raises(ValueError, match="pass interpret=True"):
    gmm(LHS, RHS, SIZES, backend="pallas_gpu", interpret=False)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU-only expectation")
def test_backend_resolution_on_cpu():
  plan = grouped_matmul._make_plan
  assert plan("auto", None, (8, 8, 8)).kernel == "reference"
  assert plan("auto", True, (8, 8, 8)).kernel == "tpu"
  assert plan("pallas", None, (8, 8, 8))[:2] == ("tpu", True)
  assert plan("pallas_gpu", None, (8, 8, 8))[:2] == ("gpu", True)
  assert plan("reference", True, (8, 8, 8)).kernel == "reference"


def test_tiles_shrink_to_small_dims_but_not_below_16():
  from moejax.kernels import gmm_tiles

  assert gmm_tiles.fit_tiling((128, 128, 128), 5, 48, 200) == (16, 64, 128)
  assert gmm_tiles.fit_tiling((8, 8, 8), 5, 48, 200) == (8, 8, 8)


def test_gpu_tiling_check_names_the_tiling():
  from moejax.kernels import gmm_gpu

  gmm_gpu.check_gpu_tiling((16, 32, 64))
  with pytest.raises(ValueError, match=r"\(8, 32, 24\)"):
    gmm_gpu.check_gpu_tiling((8, 32, 24))
