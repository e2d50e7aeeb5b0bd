"""The gathered form of the compressed expert types (moejax/experts/gathered.py): a
decode step's few rows through their own experts' codes, by the XLA:CPU FFI kernels
(kernels/cpu_gathered.py) or the XLA form. Oracles: float64 dequantize-then-matmul
in numpy, and the float LM holding the dequantized weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.experts import codebook, gathered, quantized
from moejax.experts.base import get_expert_type
from moejax.inference.generate import generation_config
from moejax.kernels import cpu_gathered
from tests.experts.compressed_lm import equals_swiglu_model_on_dense_weights, compressed_lm_config

needs_kernels = pytest.mark.skipif(not cpu_gathered.built(), reason=cpu_gathered.MISSING)
E, D_IN, D_OUT, GROUPS = 3, 64, 72, 4  # D_OUT: one 64-column register block and a tail of 8
ROW_EXPERT = np.array([2, 0, 2, 1, 0], np.int32)


def case(kernel: str, levels: int, seed: int = 0):
  """(x, codes, params, w_hat [E, D_IN, D_OUT] float64) of random codes at `levels`."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((len(ROW_EXPERT), D_IN)).astype(np.float32)
  codes = rng.integers(0, levels, (E, D_IN, D_OUT)).astype(np.float32)
  rows_of_group = np.arange(D_IN) // (D_IN // GROUPS)
  if kernel == "affine":
    scales = rng.uniform(0.01, 0.1, (E, GROUPS, D_OUT)).astype(np.float32)
    zeros = rng.integers(0, levels, (E, GROUPS, D_OUT)).astype(np.float32)
    w_hat = (codes - zeros[:, rows_of_group]) * scales[:, rows_of_group]
    return x, codes, (scales, zeros), w_hat.astype(np.float64)
  centroids = np.sort(rng.standard_normal((E, GROUPS, levels)), axis=-1).astype(np.float32)
  index = codes.astype(int)
  w_hat = centroids[np.arange(E)[:, None, None], rows_of_group[None, :, None], index]
  return x, codes, (centroids,), w_hat.astype(np.float64)


def assert_relative(got, want, tol=1e-5):
  err = np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want))
  assert err <= tol, f"max error {err:.2e} of the largest entry"


DENSE_ROWS = {"affine": quantized.dense_rows, "lookup": codebook.dense_rows}


@needs_kernels
@pytest.mark.parametrize("kernel,levels", [("affine", 16), ("lookup", 16), ("lookup", 256)])
def test_kernel_and_xla_form_equal_dequantize_then_matmul(kernel, levels):
  x, codes, params, w_hat = case(kernel, levels)
  want = np.einsum("ra,rab->rb", x.astype(np.float64), w_hat[ROW_EXPERT])
  rows = jnp.asarray(ROW_EXPERT)
  ffi = cpu_gathered.gathered_matmul(kernel, jnp.asarray(x), codes, params, rows)
  assert_relative(ffi, want)
  assert_relative(jax.jit(DENSE_ROWS[kernel])(x, rows, codes, *params), want)


@needs_kernels
def test_the_kernel_reads_the_stored_uint8_codes_and_no_float_copy_of_the_layer():
  x, codes, params, _ = case("affine", 16)
  stored = jnp.asarray(codes, jnp.uint8)

  def step(x, stored, scales, zeros):
    as_carried = stored.astype(jnp.float32)  # how weights(dtype) hands codes over
    return gathered.rows_matmul(
      "affine", quantized.dense_rows, x, jnp.asarray(ROW_EXPERT), as_carried, (scales, zeros), "ffi"
    )

  compiled = jax.jit(step).lower(x, stored, *params).compile()
  text = compiled.as_text()
  assert cpu_gathered.TARGETS["affine"][0] in text
  assert f"f32[{E},{D_IN},{D_OUT}]" not in text, "the codes were converted to float32"
  assert compiled.memory_analysis().temp_size_in_bytes < 4 * D_IN * D_OUT


COMPRESSED = [
  ("quantized", {"bits": 4}),
  ("quantized", {"bits": 2, "symmetric": True}),
  ("codebook", {"bits": 4}),
  ("codebook", {"bits": 3, "rotation": "hadamard"}),
]
# every type through the kernels where they are built; the XLA form on two of them
LM_CASES = [(*c, "ffi") for c in COMPRESSED if cpu_gathered.built()]
LM_CASES += [(*COMPRESSED[i], "xla") for i in (0, 3)]


@pytest.mark.parametrize("experts,settings,decode_kernel", LM_CASES)
def test_decode_logits_equal_the_float_lm_on_the_dequantized_weights(
  experts, settings, decode_kernel
):
  m = generation_config(
    compressed_lm_config(experts=experts, decode_kernel=decode_kernel, **settings).model
  )
  assert 2 * m.moe.top_k <= m.moe.num_experts  # 2 tokens: grouped_matmul 'auto' gathers
  rotation = settings.get("rotation", "none")

  def dense(weights):
    if experts == "quantized":
      return quantized.dense_weights(weights, jnp.float32)
    return codebook.dense_weights(weights, jnp.float32, rotation)

  equals_swiglu_model_on_dense_weights(m, dense, shape=(1, 2))


def test_ffi_without_the_kernels_is_refused_and_auto_falls_back_with_a_warning(monkeypatch):
  monkeypatch.setattr(cpu_gathered, "built", lambda: False)
  monkeypatch.setattr(cpu_gathered, "warn_missing", cpu_gathered.warn_missing.__wrapped__)
  spec = get_expert_type("quantized")
  with pytest.raises(ConfigError, match=r"model\.moe\.quantized\.decode_kernel='ffi'.*g\+\+"):
    spec.validate({**spec.settings, "decode_kernel": "ffi"})
  with pytest.raises(ConfigError, match=r"model\.moe\.codebook\.decode_kernel='fast'"):
    get_expert_type("codebook").validate({**codebook.SETTINGS, "decode_kernel": "fast"})
  x, codes, params, w_hat = case("affine", 16)
  with pytest.warns(UserWarning, match="decode through XLA"):
    got = gathered.rows_matmul(
      "affine", quantized.dense_rows, x, jnp.asarray(ROW_EXPERT), codes, params, "auto"
    )
  assert_relative(got, np.einsum("ra,rab->rb", x.astype(np.float64), w_hat[ROW_EXPERT]))
