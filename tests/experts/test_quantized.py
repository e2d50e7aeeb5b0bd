"""Expert type 'quantized' (moejax/experts/quantized.py, issue 15): its output is
SwiGLU on its dequantized weights, 8 bits are within rounding error of the
float experts, bits differ per expert, the byte report is the hand count, the
codes are never trained and survive checkpoints bit for bit, KV-cache decoding
equals the full forward, and bad settings or checkpoints are refused."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.validation import validate_config
from moejax.errors import ConfigError
from moejax.experts import compressed as cz
from moejax.experts import quantized as qt
from moejax.models import Decoder
from moejax.posttrain import compress, quantize
from moejax.train.checkpoint import Checkpointer
from moejax.train.loop import init_state, train_and_evaluate
from moejax.train.restore import load_from_workdir
from tests.experts.compressed_lm import (
  D,
  E,
  F,
  compressed_lm_error,
  equals_swiglu_model_on_dense_weights,
  float_weights,
  relative,
  swiglu64,
  compressed_lm_config,
)
from tests.helpers import moe_cfg

GROUP = 8


def numpy_dequantized(arrays):
  """(code - zero) * scale written again in numpy float64, apart from the type's jnp."""
  out = {}
  for m in cz.MATRICES:
    codes = arrays[f"{m}_codes"].astype(np.float64)
    step = codes.shape[1] // arrays[f"{m}_scales"].shape[1]
    zeros = np.repeat(arrays[f"{m}_zeros"].astype(np.float64), step, axis=1)
    out[m] = (codes - zeros) * np.repeat(arrays[f"{m}_scales"].astype(np.float64), step, axis=1)
  return out


def layer(bits=4, symmetric=False, group_size=GROUP):
  cfg = moe_cfg(
    num_experts=E,
    expert_d_ff=F,
    experts="quantized",
    quantized=dict(bits=bits, group_size=group_size, symmetric=symmetric),
  )
  return qt.QUANTIZED.build(E, D, cfg, rngs=nnx.Rngs(0))


def inputs(n=24, seed=1):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((n, D)), jnp.float32)


def block_matmul(rows, w):
  """A grouped matmul for rows in E equal blocks, block e times w[e]."""
  blocks = rows.reshape(w.shape[0], -1, rows.shape[-1])
  return jnp.einsum("ena,eab->enb", blocks, w, precision="highest").reshape(-1, w.shape[-1])


@pytest.mark.parametrize("symmetric", [False, True])
def test_output_is_swiglu_of_the_dequantized_weights(symmetric):
  experts = layer(bits=4, symmetric=symmetric)
  arrays, weights = cz.host(experts.arrays()), experts.weights(jnp.float32)
  w_hat = numpy_dequantized(arrays)
  x = inputs()
  grouped = np.asarray(qt.quantized_experts(weights, jnp.tile(x, (E, 1)), block_matmul))
  for e in range(E):
    want = swiglu64(w_hat, e, x)
    got = qt.quantized_expert({k: v[e] for k, v in weights.items()}, x)
    assert (
      relative(got, want) <= 1e-6 and relative(grouped[e * len(x) : (e + 1) * len(x)], want) <= 1e-6
    )
  assert set(np.unique(arrays["bits"])) == {4} and arrays["w_gate_codes"].dtype == np.uint8


def test_build_is_round_to_nearest_of_the_swiglu_init():
  float_init = cz.host(cz.float_init(E, D, F, nnx.Rngs(0)))
  arrays = cz.host(layer(bits=4).arrays())
  w_hat = numpy_dequantized(arrays)
  agree = []
  for m in cz.MATRICES:
    step = np.repeat(arrays[f"{m}_scales"], GROUP, axis=1)
    assert np.all(np.abs(w_hat[m] - float_init[m]) <= step / 2 * (1 + 1e-5))
    q = [quantize.rtn(w, 4, GROUP) for w in float_init[m]]
    agree.append(np.mean(np.stack([p.codes for p in q]) == arrays[f"{m}_codes"]))
  print(f"build codes equal posttrain RTN's (float64) on {min(agree):.5f} of the weights")
  assert min(agree) >= 0.999


def test_eight_bits_are_within_the_rounding_error_of_the_float_experts():
  w = float_weights()
  arrays = compress.quantized_from_float(w, 8, GROUP)
  w_hat = numpy_dequantized(arrays)
  x = np.asarray(inputs(n=256))
  measured, predicted, swiglu_error = [], [], []
  for e in range(E):  # x @ dW: rounding errors ~ uniform on +-s/2, variance s^2 / 12
    step = np.repeat(arrays["w_gate_scales"][e].astype(np.float64), GROUP, axis=0)
    assert np.all(np.abs(w_hat["w_gate"][e] - w["w_gate"][e]) <= step / 2 * (1 + 1e-5))
    measured.append(np.mean((x @ (w_hat["w_gate"][e] - w["w_gate"][e])) ** 2))
    predicted.append(np.mean(x.astype(np.float64) ** 2 @ step**2 / 12))
    want = swiglu64(w, e, x)
    got = qt.quantized_expert(
      {k: jnp.asarray(v[e], jnp.float32) for k, v in arrays.items() if k != "bits"}, jnp.asarray(x)
    )
    swiglu_error.append(relative(got, want))
  ratio = np.sqrt(np.sum(measured) / np.sum(predicted))
  print(
    f"8-bit gate error RMS / uniform-rounding prediction = {ratio:.3f}; SwiGLU max "
    f"relative error per expert {np.round(swiglu_error, 5)}"
  )
  assert 0.9 <= ratio <= 1.1 and max(swiglu_error) < 1e-2


def test_each_expert_has_its_own_bits_and_the_byte_report_is_the_hand_count():
  bits = [2, 8, 4, 3]
  w = float_weights(seed=3)
  for symmetric in (False, True):
    arrays = compress.quantized_from_float(w, bits, GROUP, symmetric=symmetric)
    experts = layer(symmetric=symmetric)
    experts.assign(arrays)
    held = cz.host(experts.arrays())
    np.testing.assert_array_equal(held["bits"], bits)
    w_hat, weights = numpy_dequantized(held), experts.weights(jnp.float32)
    x, errors = inputs(), []
    for e, b in enumerate(bits):
      assert max(held[f"{m}_{p}"][e].max() for m in cz.MATRICES for p in ("codes", "zeros")) < 2**b
      got = qt.quantized_expert({k: v[e] for k, v in weights.items()}, x)
      assert relative(got, swiglu64(w_hat, e, x)) <= 1e-6
      errors.append(relative(got, swiglu64(w, e, x)))
    print(f"symmetric={symmetric}: error vs float per expert at bits {bits}: {np.round(errors, 4)}")
    assert errors[0] > 10 * errors[1]  # 2 bits vs 8 bits
    # Per expert: codes of 3 matrices of 512 weights, and 3 x 64 zero points, at
    # b bits; 3 x 64 float32 scales per expert; one byte of bits per expert.
    hand = sum(3 * 512 * b // 8 + (0 if symmetric else 3 * 64 * b // 8) for b in bits)
    hand += E * 3 * 64 * 4 + E
    assert hand == (6340 if symmetric else 6748)
    assert experts.packed_bytes() == hand
    packed = qt.pack(held, symmetric)
    assert sum(a.nbytes for a in jax.tree.leaves(packed)) == hand
    shapes = {k: v.shape for k, v in held.items()}
    jax.tree.map(np.testing.assert_array_equal, qt.unpack(packed, shapes, symmetric), held)


@pytest.mark.parametrize("bits", cz.SUPPORTED_BITS)
def test_bit_packing_round_trips(bits):
  codes = np.random.default_rng(bits).integers(0, 2**bits, (3, 5, 7)).astype(np.uint8)
  packed = cz.pack_bits(codes, bits)
  assert packed.dtype == np.uint8 and packed.nbytes == -(-codes.size * bits // 8)
  np.testing.assert_array_equal(cz.unpack_bits(packed, bits, codes.shape), codes)
  with pytest.raises(ValueError, match="cannot be packed"):
    cz.pack_bits(codes + 2**bits if bits < 8 else codes.astype(np.int16) + 256, bits)


def compressed_arrays(rest):
  return {
    ".".join(map(str, path)): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_flatten_with_path(rest)[0]
    if any(getattr(k, "key", None) == "experts" for k in path)
  }


@pytest.mark.integration
def test_codes_are_not_trained_and_the_checkpoint_is_exact(data_dir, tmp_path):
  config = compressed_lm_config(data_dir)
  _, start, _ = init_state(config)
  run = train_and_evaluate(config, str(tmp_path), write_metrics=False)
  before, after = compressed_arrays(start.rest), compressed_arrays(run.state.rest)
  assert len(before) == 2 * 10  # two MoE blocks: 3 x (codes, scales, zeros) + bits
  jax.tree.map(np.testing.assert_array_equal, after, before)
  assert not [k for k in compressed_arrays(start.params)]  # no expert array is a Param
  changed = jax.tree.map(
    lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), start.params, run.state.params
  )
  assert all(jax.tree.leaves(changed)), changed  # router, attention, norms, embeddings
  assert changed["blocks"][0]["ffn"]["router_kernel"]
  _, _, params, rest, _ = load_from_workdir(str(tmp_path))
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.tree.map(np.asarray, (params, rest)),
    jax.tree.map(np.asarray, (run.state.params, run.state.rest)),
  )
  # The same workdir under a float (swiglu) config is refused, before any restore.
  float_config = compressed_lm_config(data_dir)
  float_config.model.moe.experts = "swiglu"
  with pytest.raises(
    ConfigError,
    match=r"incompatible config.*model\.moe\.experts: "
    r"checkpoint='quantized' config='swiglu'",
  ):
    train_and_evaluate(float_config, str(tmp_path), write_metrics=False)
  _, float_state, _ = init_state(float_config)  # and the checkpointer itself refuses it
  with pytest.raises(ConfigError, match="cannot read checkpoint"):
    Checkpointer(str(tmp_path), read_only=True).restore(2, jax.tree.map(np.asarray, float_state))


def test_the_lm_equals_a_swiglu_lm_on_its_dequantized_weights():
  equals_swiglu_model_on_dense_weights(
    compressed_lm_config().model, lambda w: qt.dense_weights(w, jnp.float32)
  )


@pytest.mark.integration
def test_a_float_lm_compressed_at_8_bits_keeps_its_logits():
  """compress.compress_model: the tiny float LM, its experts by RTN and GPTQ
  (identity Hessians: GPTQ = RTN) at 8 and 3 bits, group 16, all else copied."""
  m = compressed_lm_config().model
  errors = {
    (b, quantizer): compressed_lm_error(
      m,
      lambda w: compress.quantized_from_float(
        w,
        b,
        16,
        quantizer=quantizer,
        hessians={
          k: np.broadcast_to(np.eye(v.shape[1]), (v.shape[0], v.shape[1], v.shape[1]))
          for k, v in w.items()
        },
      ),
    )
    for b in (8, 3)
    for quantizer in compress.QUANTIZERS
  }
  print("logits error / max |logits| by (bits, quantizer):", errors)
  assert errors[8, "rtn"] == errors[8, "gptq"] < 1e-2 and errors[3, "rtn"] > 10 * errors[8, "rtn"]


def test_bad_settings_are_refused():
  for key, value, message in [
    ("bits", 5, r"model\.moe\.quantized\.bits=5 is not supported"),
    ("group_size", -8, r"model\.moe\.quantized\.group_size=-8 must be an integer >= 0"),
  ]:
    config = compressed_lm_config(**{key: value})
    with pytest.raises(ConfigError, match=message):
      validate_config(config)
  with pytest.raises(ConfigError, match=r"model\.moe\.quantized\.symmetric='yes' must be"):
    qt.validate_quantized({"bits": 4, "group_size": 0, "symmetric": "yes"})  # a typed
    # ConfigDict refuses a str for a bool itself; a hand-built section may hold one
  config = compressed_lm_config(group_size=12)
  validate_config(config)  # the dims are the layer's: refused when it is built
  with pytest.raises(
    ConfigError,
    match=r"model\.moe\.quantized\.group_size=12 must divide"
    r".*d_model=32, expert_d_ff=32",
  ):
    Decoder(ml_collections.FrozenConfigDict(config.model), rngs=nnx.Rngs(0))
  w = float_weights()
  with pytest.raises(ConfigError, match="bits=5"):
    compress.quantized_from_float(w, [4, 5, 4, 4], GROUP)
  with pytest.raises(ConfigError, match="needs hessians"):
    compress.quantized_from_float(w, 4, GROUP, quantizer="gptq")
  arrays = compress.quantized_from_float(w, 2, GROUP)
  arrays["w_up_codes"] = arrays["w_up_codes"] + 4  # beyond 2 bits
  with pytest.raises(ValueError, match="outside"):
    layer().assign(arrays)
  with pytest.raises(ValueError, match="symmetric layer"):
    layer(symmetric=True).assign(compress.quantized_from_float(w, 4, GROUP))


@pytest.mark.parametrize("quantizer,symmetric", [("rtn", True), ("gptq", False), ("gptq", True)])
def test_converted_arrays_hold_what_the_offline_quantizer_computed(quantizer, symmetric):
  """compress.quantized_from_float stores quantize.rtn / gptq of each expert
  matrix (symmetric int8 codes offset into uint8): the same w_hat, bit for bit."""
  w, bits = float_weights(seed=5), [3, 4, 8, 2]
  rng = np.random.default_rng(6)
  hessians = {
    m: np.stack(
      [quantize.input_hessian(rng.standard_normal((64, w[m].shape[1]))) for _ in range(E)]
    )
    for m in cz.MATRICES
  }
  arrays = compress.quantized_from_float(
    w, bits, GROUP, symmetric=symmetric, quantizer=quantizer, hessians=hessians
  )
  for m in cz.MATRICES:
    for e, b in enumerate(bits):
      q = (
        quantize.gptq(w[m][e], hessians[m][e], b, GROUP, symmetric=symmetric)
        if quantizer == "gptq"
        else quantize.rtn(w[m][e], b, GROUP, symmetric=symmetric)
      )
      got = qt.dequantize(
        arrays[f"{m}_codes"][e], arrays[f"{m}_scales"][e], arrays[f"{m}_zeros"][e]
      )
      np.testing.assert_array_equal(np.asarray(got), quantize.dequantize(q))
