"""Activation fake-quantization of the compressed expert types (act_bits;
CodeQuant, ICLR 2026, arXiv 2604.10496: W4A4 / W4A8) and the codebook options
it comes with: the quantizer is the per-token min-max grid by hand, its gradient
straight through; the expert functions equal a numpy SwiGLU whose every matmul
input is quantized (after the rotation, for the codebook types); with act_bits,
per-output-column codebooks and learned rotations, every dispatcher and grouped
matmul equals the per-token loop (the contract check on variants registered for
the test); bad settings are refused naming the key."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.errors import ConfigError
from moejax.experts import EXPERT_TYPES
from moejax.experts import codebook as cb
from moejax.experts import compressed as cz
from moejax.experts import quantized as qz
from tests.contract.oracles import F, check_dispatch
from tests.contract.dispatch_oracles import cases
from tests.helpers import moe_cfg

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


def numpy_fake_quant(x, bits):
  """Per row: levels low + k (high - low) / (2^b - 1), the nearest one."""
  x = np.asarray(x, np.float64)
  low, high = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
  scale = np.maximum((high - low) / (2**bits - 1), 1e-5)
  return np.round((x - low) / scale) * scale + low


@pytest.mark.parametrize("bits", [4, 8])
def test_fake_quant_is_the_per_token_min_max_grid(bits):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((64, 32)).astype(np.float32)
  x[:, 3] *= 30.0  # an outlier channel
  q = np.asarray(cz.fake_quant(jnp.asarray(x), bits), np.float64)
  np.testing.assert_allclose(q, numpy_fake_quant(x, bits), rtol=0, atol=1e-5)
  scale = (x.max(1) - x.min(1)) / (2**bits - 1)
  assert np.all(np.abs(q - x).max(1) <= scale / 2 * (1 + 1e-5))
  assert all(len(np.unique(np.round((r - r.min()) / s))) <= 2**bits for r, s in zip(q, scale))
  np.testing.assert_allclose(q.min(1), x.min(1), atol=1e-5)  # the range is kept
  np.testing.assert_array_equal(np.asarray(cz.fake_quant(jnp.asarray(x), 0)), x)
  p = rng.standard_normal(x.shape).astype(np.float32)
  grad = jax.grad(lambda v: jnp.sum(cz.fake_quant(v, bits) * p))(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(grad), p)  # straight through


def numpy_swiglu(weights, x, bits, rotations=None):
  """SwiGLU in float64 with each matmul input v -> Q(v @ R)."""
  rotations = rotations or {}

  def project(v, m):
    R = rotations.get(m)
    v = v if R is None else v @ R
    return numpy_fake_quant(v, bits) @ np.asarray(weights[m], np.float64)

  gate, up = project(x, "w_gate"), project(x, "w_up")
  return project(gate / (1 + np.exp(-gate)) * up, "w_down")


def test_the_quantized_expert_quantizes_every_matmul_input():
  layer = qz.QUANTIZED.build(4, 16, moe_cfg(num_experts=4, expert_d_ff=8), rngs=nnx.Rngs(0))
  weights = layer.weights(jnp.float32)
  one = {k: v[1] for k, v in weights.items()}
  dense = {m: np.asarray(w)[1] for m, w in qz.dense_weights(weights, jnp.float32).items()}
  x = np.random.default_rng(1).standard_normal((6, 16)).astype(np.float32)
  got = np.asarray(qz.quantized_expert(one, jnp.asarray(x), act_bits=4))
  np.testing.assert_allclose(got, numpy_swiglu(dense, x, 4), rtol=0, atol=2e-5)
  floats = np.asarray(qz.quantized_expert(one, jnp.asarray(x)))
  assert np.abs(floats - got).max() > 1e-3  # the quantizer changes the output


@pytest.mark.parametrize("type_name", [cb.NAME, cb.ROTATED])
def test_the_codebook_expert_quantizes_after_the_rotation(type_name):
  """Hadamard ('codebook') or stored learned rotations ('codebook_rotated', here a
  random orthogonal R per expert input): Q(x R) @ w_hat, not Q(x) R w_hat."""
  spec = EXPERT_TYPES.get(type_name)
  section = {
    "per_output_column": True,
    **({"rotation": "hadamard"} if type_name == cb.NAME else {}),
  }
  cfg = moe_cfg(num_experts=2, expert_d_ff=8, experts=type_name, **{type_name: section})
  layer = spec.build(2, 16, cfg, rngs=nnx.Rngs(0))
  weights = dict(layer.weights(jnp.float32))
  rng = np.random.default_rng(2)
  rotations = {"w_gate": cb.hadamard(16), "w_up": cb.hadamard(16), "w_down": cb.hadamard(8)}
  if type_name == cb.ROTATED:
    for m, n in (("w_gate", 16), ("w_down", 8)):
      R = np.linalg.qr(rng.standard_normal((n, n)))[0].astype(np.float32)
      weights[cb.ROTATION_KEYS[m]] = jnp.stack([jnp.asarray(R)] * 2)
      rotations[m] = R
    rotations["w_up"] = rotations["w_gate"]
  dense = cb.dense_weights(weights, jnp.float32, "none", per_output_column=True, fold=False)
  dense = {m: np.asarray(w)[0] for m, w in dense.items()}
  assert dense["w_gate"].shape == (16, 8)
  assert all(len(np.unique(dense["w_up"][:, j])) <= 16 for j in range(8))  # a book per column
  x = rng.standard_normal((6, 16)).astype(np.float32)
  x[:, 5] *= 20.0
  one = {k: v[0] for k, v in weights.items()}
  options = {
    "per_output_column": True,
    **({"rotation": "hadamard"} if type_name == cb.NAME else {}),
  }
  got = np.asarray(spec.expert(one, jnp.asarray(x), act_bits=4, **options))
  np.testing.assert_allclose(got, numpy_swiglu(dense, x, 4, rotations), rtol=0, atol=5e-5)
  before = numpy_swiglu({m: rotations[m] @ w for m, w in dense.items()}, x, 4)  # Q(x) R w_hat
  assert np.abs(before - got).max() > 1e-3


def _per_column_build(spec, rotation):
  def build(num_experts, d_model, cfg, *, rngs):
    cls = cb.RotatedCodebookExperts if spec.name == cb.ROTATED else cb.CodebookExperts
    return cls(
      num_experts,
      d_model,
      cfg.expert_d_ff,
      bits=4,
      group_size=0,
      rotation=rotation,
      per_output_column=True,
      rngs=rngs,
    )

  return build


VARIANTS = [
  (qz.QUANTIZED, {"act_bits": 4}),
  (cb.CODEBOOK, {"act_bits": 4, "per_output_column": True}),
  (cb.CODEBOOK_ROTATED, {"act_bits": 4, "per_output_column": True}),
]


@pytest.mark.integration
@pytest.mark.parametrize("spec,settings", VARIANTS, ids=[s.name for s, _ in VARIANTS])
def test_with_act_bits_every_dispatch_equals_the_per_token_loop(spec, settings):
  """The contract check (tests/contract/oracles.py: output and gradients against the
  float64 per-token loop of the expert function) at act_bits 4, per-column books."""
  variant = dataclasses.replace(
    spec, name=f"{spec.name}_a4", settings={**spec.settings, **settings}
  )
  if spec is not qz.QUANTIZED:
    variant = dataclasses.replace(variant, build=_per_column_build(spec, "none"))
  assert F % 2 == 0
  with EXPERT_TYPES.temporarily(variant.name, variant):
    for dispatcher, matmul, backend in cases(variant):
      overrides = {} if backend is None else {"gmm": {"backend": backend}}
      check_dispatch(variant, dispatcher, matmul, **overrides)


@pytest.mark.parametrize(
  "experts,section,key",
  [
    ("quantized", {"act_bits": 5}, "model.moe.quantized.act_bits=5"),
    ("codebook", {"act_bits": True}, "model.moe.codebook.act_bits=True"),
    ("codebook", {"per_output_column": 1}, "model.moe.codebook.per_output_column=1"),
    ("codebook_rotated", {"act_bits": 16}, "model.moe.codebook_rotated.act_bits=16"),
  ],
)
def test_bad_settings_are_refused_naming_the_key(experts, section, key):
  spec = EXPERT_TYPES.get(experts)
  with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
    spec.validate({**spec.settings, **section})
