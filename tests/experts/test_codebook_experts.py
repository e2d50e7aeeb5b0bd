"""Expert type 'codebook' (moejax/experts/codebook.py, issue 15): the LUT expert
is SwiGLU on its decoded, rotated weights; with a centroid per distinct value
it is the float expert exactly, Hadamard rotation included; its dense and fused
dispatch paths fold the rotation and equal the LUT per-token loop; the byte
report is the hand count; the codebook LM decodes with a KV cache as it runs
in full and equals a swiglu LM on its decoded weights; bad settings are refused."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.config import validate_config
from moejax.dispatch import DISPATCHERS
from moejax.errors import ConfigError
from moejax.experts import codebook as cb
from moejax.experts import compressed as cz
from moejax.models import Decoder
from moejax.posttrain import compress
from tests.contract.oracles import contract_cfg, contract_routing, per_token_loop
from tests.experts.compressed_lm import (D, E, F, compressed_lm_error,
                                         equals_swiglu_model_on_dense_weights, float_weights,
                                         relative, swiglu64, tiny_config)
from tests.helpers import moe_cfg

GROUP = 8


def layer(bits=4, rotation="none", group_size=GROUP):
  cfg = moe_cfg(num_experts=E, expert_d_ff=F, experts="codebook",
                codebook=dict(bits=bits, group_size=group_size, rotation=rotation))
  return cb.CODEBOOK.build(E, D, cfg, rngs=nnx.Rngs(0))


def numpy_decoded(arrays, rotation):
  """R @ centroids[group of row, index] per expert, numpy float64."""
  out = {}
  for m in cz.MATRICES:
    idx, cent = arrays[f"{m}_indices"].astype(np.int64), arrays[f"{m}_centroids"]
    E_, d_in, _ = idx.shape
    group = (np.arange(d_in) // (d_in // cent.shape[1]))[None, :, None]
    w = cent.astype(np.float64)[np.arange(E_)[:, None, None], group, idx]
    R = cb.hadamard(d_in).astype(np.float64) if rotation == "hadamard" else np.eye(d_in)
    out[m] = np.einsum("ab,ebo->eao", R, w)
  return out


def inputs(n=24, seed=1):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((n, D)), jnp.float32)


@pytest.mark.parametrize("rotation", cb.ROTATIONS)
def test_lut_expert_is_swiglu_of_the_decoded_rotated_weights(rotation):
  experts = layer(rotation=rotation)
  arrays, weights = cz.host(experts.arrays()), experts.weights(jnp.float32)
  assert arrays["w_down_centroids"].shape == (E, F // GROUP, 16)
  w_hat, x = numpy_decoded(arrays, rotation), inputs()
  for e in range(E):
    got = cb.codebook_expert({k: v[e] for k, v in weights.items()}, x, rotation=rotation)
    assert relative(got, swiglu64(w_hat, e, x)) <= 1e-6
  dense = cb.dense_weights(weights, jnp.float32, rotation)
  for m in cz.MATRICES:
    np.testing.assert_allclose(dense[m], w_hat[m], atol=1e-6 * np.abs(w_hat[m]).max())


@pytest.mark.parametrize("rotation", cb.ROTATIONS)
def test_a_centroid_per_distinct_value_gives_the_float_experts(rotation):
  """8 bits, groups of 8 rows x 16 or 32 columns: <= 256 values per group, so
  Lloyd's k-means is exact on R^T W and the rotated LUT expert is the float one;
  without applying R online it would compute x R^T W instead."""
  w = float_weights(seed=2)
  arrays = compress.codebook_from_float(w, 8, GROUP, rotation=rotation)
  experts = layer(bits=8, rotation=rotation)
  experts.assign(arrays)
  weights, x = experts.weights(jnp.float32), inputs()
  errors = []
  for e in range(E):
    got = cb.codebook_expert({k: v[e] for k, v in weights.items()}, x, rotation=rotation)
    errors.append(relative(got, swiglu64(w, e, x)))
    if rotation == "hadamard":  # the stored codebooks are of R^T W, not W
      unrotated = cb.codebook_expert({k: v[e] for k, v in weights.items()}, x)
      assert relative(unrotated, swiglu64(w, e, x)) > 0.1
  print(f"rotation {rotation}: 8-bit codebook vs float, max relative error {max(errors):.2e}")
  assert max(errors) <= 1e-5


def test_dense_and_fused_paths_fold_the_rotation_and_equal_the_lut_loop():
  """Hadamard rotation (the contract runs the default 'none' at d_ff 6): tiled
  grouped matmul and the fused SonicMoE path against the per-token LUT loop,
  output and gradient with respect to x."""
  width = 16
  cfg = contract_cfg(experts="codebook", expert_d_ff=width,
                     codebook=dict(rotation="hadamard", bits=3, group_size=4))
  routing = contract_routing()
  num_experts = cfg.num_experts
  weights = cb.CODEBOOK.build(num_experts, width, cfg, rngs=nnx.Rngs(3)).weights(jnp.float32)
  x = jnp.asarray(np.random.default_rng(4).standard_normal((routing.expert_index.shape[0], width)),
                  jnp.float32)

  def loop(x):
    return per_token_loop(cb.codebook_expert, weights, x, routing.expert_index,
                          routing.combine_weight, routing.valid, {"rotation": "hadamard"})

  want, want_dx = jax.jit(lambda x: (loop(x), jax.grad(lambda x: jnp.sum(loop(x) ** 2))(x)))(x)
  for dispatcher, matmul in [("dropless", "tiled"), ("dropless", "fused"), ("capacity", "auto")]:
    c = contract_cfg(experts="codebook", expert_d_ff=width, dispatch=dispatcher,
                     grouped_matmul=matmul, codebook=dict(rotation="hadamard", bits=3,
                                                          group_size=4))
    run = lambda x: DISPATCHERS.get(dispatcher)(x, routing, cb.CODEBOOK.bind(weights, c), c)[0]
    got, dx = jax.jit(lambda x: (run(x), jax.grad(lambda x: jnp.sum(run(x) ** 2))(x)))(x)
    assert relative(got, np.asarray(want)) <= 1e-5, (dispatcher, matmul)
    assert relative(dx, np.asarray(want_dx)) <= 1e-5, (dispatcher, matmul)


def test_the_byte_report_is_the_hand_count():
  experts = layer(bits=4)
  # indices: 3 matrices x 4 experts x 512 weights at 4 bits; centroids: (4 + 4 + 2)
  # groups x 16 per expert, float32; the Hadamard matrix is never stored.
  hand = 3 * E * 512 * 4 // 8 + (4 + 4 + 2) * 16 * E * 4
  assert hand == 5632 and experts.packed_bytes() == hand
  held = cz.host(experts.arrays())
  packed = cb.pack(held)
  assert sum(a.nbytes for a in jax.tree.leaves(packed)) == hand
  assert sum(a.nbytes for a in held.values()) == 3 * E * 512 + (4 + 4 + 2) * 16 * E * 4
  jax.tree.map(np.testing.assert_array_equal,
               cb.unpack(packed, {k: v.shape for k, v in held.items()}), held)


def test_the_lm_equals_a_swiglu_lm_on_its_decoded_weights():
  equals_swiglu_model_on_dense_weights(
      tiny_config(experts="codebook", rotation="hadamard").model,
      lambda w: cb.dense_weights(w, jnp.float32, "hadamard"))


def test_a_float_lm_compressed_with_a_centroid_per_value_keeps_its_logits():
  """compress.compress_model at 8 bits, groups of 8 rows x 32 columns = 256
  values: the codebook LM is the float tiny LM, Hadamard rotation and all."""
  m = tiny_config(experts="codebook", rotation="hadamard", bits=8, group_size=8).model
  error = compressed_lm_error(m, lambda w: compress.codebook_from_float(
      w, 8, 8, rotation="hadamard"))
  print(f"codebook LM vs float LM: logits error / max |logits| = {error:.2e}")
  assert error <= 1e-5


def test_bad_settings_are_refused():
  for key, value, message in [
      ("bits", 5, r"model\.moe\.codebook\.bits=5 is not supported"),
      ("rotation", "random", r"model\.moe\.codebook\.rotation='random' is not known"),
      ("group_size", -1, r"model\.moe\.codebook\.group_size=-1 must be")]:
    with pytest.raises(ConfigError, match=message):
      validate_config(tiny_config(experts="codebook", **{key: value}))
  config = tiny_config(experts="codebook", rotation="hadamard")
  config.model.moe.expert_d_ff = 24
  config.model.moe.codebook.group_size = 8
  validate_config(config)  # the dims are the layer's: refused when it is built
  with pytest.raises(ConfigError, match=r"model\.moe\.codebook\.rotation='hadamard' needs "
                                        r"power-of-two .*expert_d_ff=24"):
    Decoder(ml_collections.FrozenConfigDict(config.model), rngs=nnx.Rngs(0))
  config.model.moe.codebook.group_size = 16
  with pytest.raises(ConfigError, match=r"model\.moe\.codebook\.group_size=16 must divide.*"
                                        r"expert_d_ff=24"):
    Decoder(ml_collections.FrozenConfigDict(config.model), rngs=nnx.Rngs(0))
  arrays = compress.codebook_from_float(float_weights(), 2, GROUP, iterations=5)
  arrays["w_gate_indices"][0, 0, 0] = 4  # beyond 2 bits
  with pytest.raises(ValueError, match="outside"):
    layer(bits=2).assign(arrays)
