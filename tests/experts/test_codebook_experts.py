"""Expert type 'codebook' (moejax/experts/codebook.py, issue 15): the LUT expert
is SwiGLU on its decoded, rotated weights, bits per expert included; with a
centroid per distinct value it is the float expert exactly, Hadamard rotation
included, and so at each expert's own bits; its dense and fused dispatch paths
fold the rotation and equal the LUT per-token loop; the byte report is the hand
count and pack/unpack round-trip exactly; centroid fine-tuning lowers the
calibration output error toward its least-squares optimum; mixed bits survive
a checkpoint; the codebook LM equals a swiglu LM on its decoded weights; bad
settings and arrays are refused."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.validation import validate_config
from moejax.dispatch import DISPATCHERS
from moejax.errors import ConfigError
from moejax.experts import codebook as cb
from moejax.experts import compressed as cz
from moejax.models import Decoder
from moejax.posttrain import compress
from moejax.train.checkpoint import Checkpointer
from tests.contract.oracles import contract_cfg, contract_routing, per_token_loop
from tests.experts.compressed_lm import (
  D,
  E,
  F,
  compressed_lm_error,
  equals_swiglu_model_on_dense_weights,
  float_and_compressed,
  float_weights,
  relative,
  swiglu64,
  compressed_lm_config,
)
from tests.helpers import moe_cfg

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

GROUP = 8
MIXED = [2, 3, 2, 4]  # bits per expert: average 2.75 over E = 4 experts


def layer(bits=4, rotation="none", group_size=GROUP):
  cfg = moe_cfg(
    num_experts=E,
    expert_d_ff=F,
    experts="codebook",
    codebook=dict(bits=bits, group_size=group_size, rotation=rotation),
  )
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
  cfg = contract_cfg(
    experts="codebook", expert_d_ff=width, codebook=dict(rotation="hadamard", bits=3, group_size=4)
  )
  routing = contract_routing()
  num_experts = cfg.num_experts
  weights = cb.CODEBOOK.build(num_experts, width, cfg, rngs=nnx.Rngs(3)).weights(jnp.float32)
  x = jnp.asarray(
    np.random.default_rng(4).standard_normal((routing.expert_index.shape[0], width)), jnp.float32
  )

  def loop(x):
    return per_token_loop(
      cb.codebook_expert,
      weights,
      x,
      routing.expert_index,
      routing.combine_weight,
      routing.valid,
      {"rotation": "hadamard"},
    )

  want, want_dx = jax.jit(lambda x: (loop(x), jax.grad(lambda x: jnp.sum(loop(x) ** 2))(x)))(x)
  for dispatcher, matmul in [("dropless", "tiled"), ("dropless", "fused"), ("capacity", "auto")]:
    c = contract_cfg(
      experts="codebook",
      expert_d_ff=width,
      dispatch=dispatcher,
      grouped_matmul=matmul,
      codebook=dict(rotation="hadamard", bits=3, group_size=4),
    )

    def run(x):
      return DISPATCHERS.get(dispatcher)(x, routing, cb.CODEBOOK.bind(weights, c), c)[0]

    got, dx = jax.jit(lambda x: (run(x), jax.grad(lambda x: jnp.sum(run(x) ** 2))(x)))(x)
    assert relative(got, np.asarray(want)) <= 1e-5, (dispatcher, matmul)
    assert relative(dx, np.asarray(want_dx)) <= 1e-5, (dispatcher, matmul)


def test_the_byte_report_is_the_hand_count():
  experts = layer(bits=4)
  # indices: 3 matrices x 4 experts x 512 weights at 4 bits; centroids: (4 + 4 + 2)
  # groups x 16 per expert, float32; one byte of bits per expert; the Hadamard
  # matrix is never stored.
  hand = 3 * E * 512 * 4 // 8 + (4 + 4 + 2) * 16 * E * 4 + E
  assert hand == 5636 and experts.packed_bytes() == hand
  held = cz.host(experts.arrays())
  packed = cb.pack(held)
  assert sum(a.nbytes for a in jax.tree.leaves(packed)) == hand
  assert sum(a.nbytes for a in held.values()) == 3 * E * 512 + (4 + 4 + 2) * 16 * E * 4 + E
  jax.tree.map(
    np.testing.assert_array_equal, cb.unpack(packed, {k: v.shape for k, v in held.items()}), held
  )


@pytest.mark.integration
def test_the_lm_equals_a_swiglu_lm_on_its_decoded_weights():
  equals_swiglu_model_on_dense_weights(
    compressed_lm_config(experts="codebook", rotation="hadamard").model,
    lambda w: cb.dense_weights(w, jnp.float32, "hadamard"),
  )


def test_a_float_lm_compressed_with_a_centroid_per_value_keeps_its_logits():
  """compress.compress_model at 8 bits, groups of 8 rows x 32 columns = 256
  values: the codebook LM is the float tiny LM, Hadamard rotation and all."""
  m = compressed_lm_config(experts="codebook", rotation="hadamard", bits=8, group_size=8).model
  error = compressed_lm_error(
    m, lambda w: compress.codebook_from_float(w, 8, 8, rotation="hadamard")
  )
  print(f"codebook LM vs float LM: logits error / max |logits| = {error:.2e}")
  assert error <= 1e-5


def test_bad_settings_are_refused():
  for key, value, message in [
    ("bits", 5, r"model\.moe\.codebook\.bits=5 is not supported"),
    ("rotation", "random", r"model\.moe\.codebook\.rotation='random' is not known"),
    ("group_size", -1, r"model\.moe\.codebook\.group_size=-1 must be"),
  ]:
    with pytest.raises(ConfigError, match=message):
      validate_config(compressed_lm_config(experts="codebook", **{key: value}))
  config = compressed_lm_config(experts="codebook", rotation="hadamard")
  config.model.moe.expert_d_ff = 24
  config.model.moe.codebook.group_size = 8
  validate_config(config)  # the dims are the layer's: refused when it is built
  with pytest.raises(
    ConfigError,
    match=r"model\.moe\.codebook\.rotation='hadamard' needs "
    r"power-of-two .*expert_d_ff=24",
  ):
    Decoder(ml_collections.FrozenConfigDict(config.model), rngs=nnx.Rngs(0))
  config.model.moe.codebook.group_size = 16
  with pytest.raises(
    ConfigError,
    match=r"model\.moe\.codebook\.group_size=16 must divide.*"
    r"expert_d_ff=24",
  ):
    Decoder(ml_collections.FrozenConfigDict(config.model), rngs=nnx.Rngs(0))
  arrays = compress.codebook_from_float(float_weights(), 2, GROUP, iterations=5)
  arrays["w_gate_indices"][0, 0, 0] = 4  # beyond 2 bits
  with pytest.raises(ValueError, match="outside"):
    layer(bits=2).assign(arrays)


@pytest.mark.parametrize("rotation", cb.ROTATIONS)
def test_mixed_bits_lut_expert_is_decode_then_matmul_and_bytes_are_the_hand_count(rotation):
  arrays = compress.codebook_from_float(float_weights(seed=5), MIXED, GROUP, rotation=rotation)
  experts = layer(bits=4, rotation=rotation)
  experts.assign(arrays)
  held = cz.host(experts.arrays())
  np.testing.assert_array_equal(held["bits"], MIXED)
  for m in cz.MATRICES:  # expert e indexes only its first 2^bits[e] centroids
    assert [int(held[f"{m}_indices"][e].max()) for e in range(E)] == [3, 7, 3, 15], m
  weights, x, w_hat = experts.weights(jnp.float32), inputs(), numpy_decoded(held, rotation)
  for e in range(E):
    got = cb.codebook_expert({k: v[e] for k, v in weights.items()}, x, rotation=rotation)
    assert relative(got, swiglu64(w_hat, e, x)) <= 1e-5, e
  dense = cb.dense_weights(weights, jnp.float32, rotation)
  for m in cz.MATRICES:
    np.testing.assert_allclose(dense[m], w_hat[m], atol=1e-6 * np.abs(w_hat[m]).max())
  # Per expert at b bits: 3 x 512 indices at b bits, (4 + 4 + 2) groups x 2^b
  # centroids x 4 bytes; then one byte of bits per expert.
  hand = sum(3 * 512 * b // 8 + (4 + 4 + 2) * 2**b * 4 for b in MIXED) + E
  assert hand == 192 * 11 + 40 * (4 + 8 + 4 + 16) + 4 == 3396
  assert experts.packed_bytes() == hand == cb.packed_bytes(arrays)
  assert sum(a.nbytes for a in jax.tree.leaves(cb.pack(held))) == hand
  wide = layer(bits=8, rotation=rotation)  # Kmax 256: assign pads the 16-wide codebooks
  wide.assign(arrays)
  assert wide.arrays()["w_up_centroids"].shape == (E, D // GROUP, 256)
  assert wide.packed_bytes() == hand
  for m, w in numpy_decoded(cz.host(wide.arrays()), rotation).items():
    np.testing.assert_array_equal(w, w_hat[m], err_msg=m)
  with pytest.raises(
    ValueError,
    match=r"w_gate_centroids: shape \(4, 4, 16\), the layer "
    r"holds \(4, 4, 8\)",
  ):
    layer(bits=3, rotation=rotation).assign(arrays)


def test_mixed_bits_pack_unpack_round_trip_exactly():
  arrays = compress.codebook_from_float(
    float_weights(seed=6), [3, 2, 4, 2], GROUP, rotation="hadamard", max_bits=8
  )
  assert arrays["w_down_centroids"].shape == (E, F // GROUP, 256)  # padded to Kmax = 2^8
  packed = cb.pack(arrays)
  assert [p.nbytes for p in packed["w_gate_indices"]] == [192, 128, 256, 128]  # 512 b / 8
  assert [c.shape for c in packed["w_down_centroids"]] == [(2, 8), (2, 4), (2, 16), (2, 4)]
  back = cb.unpack(packed, {k: v.shape for k, v in arrays.items()})
  assert set(back) == set(arrays)
  for name, value in arrays.items():
    assert back[name].dtype == value.dtype, name
    np.testing.assert_array_equal(back[name], value, err_msg=name)


def discrete_weights(bits, seed=7):
  """Float experts whose every group (GROUP rows x all columns) takes exactly
  2^bits[e] distinct values, each at least once."""
  rng = np.random.default_rng(seed)
  out = {}
  for m, (d_in, d_out) in {"w_gate": (D, F), "w_up": (D, F), "w_down": (F, D)}.items():
    w = np.empty((len(bits), d_in, d_out), np.float32)
    for e, b in enumerate(bits):
      for g in range(d_in // GROUP):
        values = rng.choice(np.linspace(-1, 1, 257), 2**b, replace=False)
        members = rng.permutation(np.resize(np.arange(2**b), GROUP * d_out))
        w[e, g * GROUP : (g + 1) * GROUP] = values[members].reshape(GROUP, d_out)
    out[m] = w
  return out


def test_with_a_centroid_per_distinct_value_every_expert_is_exact_at_its_own_bits():
  w = discrete_weights(MIXED)
  arrays = compress.codebook_from_float(w, MIXED, GROUP)
  decoded = numpy_decoded(arrays, "none")
  for m in cz.MATRICES:
    np.testing.assert_array_equal(decoded[m], w[m], err_msg=m)  # bit for bit
  experts = layer(bits=4)
  experts.assign(arrays)
  weights, x = experts.weights(jnp.float32), inputs()
  for e in range(E):
    got = cb.codebook_expert({k: v[e] for k, v in weights.items()}, x)
    assert relative(got, swiglu64(w, e, x)) <= 1e-5, e
  # One bit fewer per expert cannot be exact: the check can fail.
  fewer = numpy_decoded(compress.codebook_from_float(w, [2, 2, 2, 3], GROUP), "none")
  assert [np.array_equal(fewer["w_up"][e], w["w_up"][e]) for e in range(E)] == [
    True,
    False,
    True,
    False,
  ]


def test_check_arrays_refuses_indices_beyond_their_experts_bits():
  arrays = compress.codebook_from_float(float_weights(), MIXED, GROUP, iterations=5)
  experts = layer(bits=4)
  cb.check_arrays(arrays)
  for e, index, ok in [(0, 3, True), (0, 4, False), (1, 7, True), (1, 8, False), (3, 15, True)]:
    bad = {k: v.copy() for k, v in arrays.items()}
    bad["w_up_indices"][e, 5, 2] = index
    if ok:
      cb.check_arrays(bad)
      continue
    with pytest.raises(
      ValueError,
      match=rf"w_up: expert {e} has indices outside "
      rf"\[0, 2\^bits\) = \[0, {2 ** MIXED[e]}\) "
      rf"\(max {index}\)",
    ):
      experts.assign(bad)
  wide = {**arrays, "bits": np.array([2, 3, 2, 8], np.uint8)}
  with pytest.raises(
    ValueError,
    match=r"expert 3 has bits=8 but its codebooks hold 16 "
    r"centroids \(at most 4 bits\)",
  ):
    cb.check_arrays(wide)
  with pytest.raises(ConfigError, match=r"bits=5 is not supported"):
    cb.check_arrays({**arrays, "bits": np.array([2, 3, 5, 4], np.uint8)})
  tail = {k: v.copy() for k, v in arrays.items()}
  tail["w_gate_centroids"][0, 1, 9] += 1.0  # expert 0 uses 4 of 16
  with pytest.raises(
    ValueError,
    match=r"w_gate: expert 0 at 2 bits: its centroids beyond "
    r"the first 4 must repeat the last used one",
  ):
    cb.check_arrays(tail)


def calibration(w, n=64, seed=8):
  """{matrix: E arrays X_e [n, d_in]}: inputs with feature scales over two
  decades (weight-space k-means is then not output-optimal); w_down's are the
  SwiGLU hidden activations of w_gate's and w_up's."""
  rng = np.random.default_rng(seed)
  x = [
    (rng.standard_normal((n, D)) * np.geomspace(0.05, 5, D)).astype(np.float32) for _ in range(E)
  ]
  gate = [x[e] @ w["w_gate"][e] for e in range(E)]
  hidden = [
    (g / (1 + np.exp(-g)) * (x[e] @ w["w_up"][e])).astype(np.float32) for e, g in enumerate(gate)
  ]
  return {"w_gate": x, "w_up": x, "w_down": hidden}


def output_errors(arrays, w, X, rotation):
  """{(matrix, e): ||X_e W_e - X_e W_hat_e||^2}, numpy float64, W_hat = R @ decoded."""
  w_hat = numpy_decoded(arrays, rotation)
  return {
    (m, e): float(np.sum((X[m][e].astype(np.float64) @ (w[m][e] - w_hat[m][e])) ** 2))
    for m in cz.MATRICES
    for e in range(E)
  }


def least_squares_optimum(arrays, w, X, rotation, m, e):
  """min over the centroids (indices fixed) of ||X W - X R decode(idx, c)||^2."""
  idx, cent = arrays[f"{m}_indices"][e].astype(np.int64), arrays[f"{m}_centroids"][e]
  d_in, d_out = idx.shape
  K, x = cent.shape[-1], X[m][e].astype(np.float64)
  if rotation == "hadamard":
    x = x @ cb.hadamard(d_in).astype(np.float64)
  design = np.zeros((len(x), d_out, cent.shape[0] * K))
  for r in range(d_in):
    design[:, np.arange(d_out), r // (d_in // cent.shape[0]) * K + idx[r]] += x[:, r : r + 1]
  target = (X[m][e].astype(np.float64) @ w[m][e]).ravel()
  design = design.reshape(len(target), -1)
  best = np.linalg.lstsq(design, target, rcond=None)[0]
  return float(np.sum((design @ best - target) ** 2))


@pytest.mark.parametrize("rotation", cb.ROTATIONS)
def test_centroid_finetuning_lowers_the_calibration_output_error(rotation):
  """CodeQuant's fine-tuning at mixed bits: per expert matrix, the output error
  on its calibration inputs never rises above the k-means book's and closes most
  of the gap to the least-squares optimum over the centroids (indices fixed),
  which with a Hadamard rotation is over X R and R^T W."""
  w, steps = float_weights(seed=9), 150
  X = calibration(w)
  kmeans = compress.codebook_from_float(w, MIXED, GROUP, rotation=rotation)
  tuned = compress.codebook_from_float(
    w,
    MIXED,
    GROUP,
    rotation=rotation,
    calibration_inputs=X,
    finetune_steps=steps,
    finetune_lr=0.02,
    finetune_optimizer="adam",
  )
  before, after = output_errors(kmeans, w, X, rotation), output_errors(tuned, w, X, rotation)
  closed = []
  for (m, e), error in after.items():
    optimum = least_squares_optimum(kmeans, w, X, rotation, m, e)
    assert optimum * (1 - 1e-6) <= error <= before[m, e], (m, e, optimum, error, before[m, e])
    closed.append((before[m, e] - error) / (before[m, e] - optimum))
    for c in tuned[f"{m}_centroids"][e]:  # each codebook sorted again
      assert np.all(np.diff(c) >= 0), (m, e)
  print(
    f"{rotation}: output error k-means {sum(before.values()):.3f} -> fine-tuned "
    f"{sum(after.values()):.3f}; gap to the optimum closed "
    f"{min(closed):.3f}..{max(closed):.3f}"
  )
  assert min(closed) >= 0.99


def test_finetuning_needs_calibration_inputs_and_skips_experts_without_tokens():
  w = float_weights(seed=9)
  X = {m: [x if e != 2 else x[:0] for e, x in enumerate(xs)] for m, xs in calibration(w).items()}
  kmeans = compress.codebook_from_float(w, MIXED, GROUP)
  tuned = compress.codebook_from_float(
    w,
    MIXED,
    GROUP,
    calibration_inputs=X,
    finetune_steps=20,
    finetune_lr=0.02,
    finetune_optimizer="adam",
  )
  for m in cz.MATRICES:
    for part in ("indices", "centroids"):
      changed = [
        not np.array_equal(tuned[f"{m}_{part}"][e], kmeans[f"{m}_{part}"][e]) for e in range(E)
      ]
      assert not changed[2] and (part == "indices" or any(changed)), (m, part)
  with pytest.raises(ConfigError, match=r"finetune_steps=3 needs calibration_inputs"):
    compress.codebook_from_float(float_weights(), 2, GROUP, finetune_steps=3)
  with pytest.raises(ConfigError, match=r"max_bits=3 is below the widest expert's bits=4"):
    compress.codebook_from_float(float_weights(), MIXED, GROUP, max_bits=3)


def test_mixed_bits_survive_a_checkpoint(tmp_path):
  """The bits variable is model state: a codebook LM holding mixed bits is saved
  and restored into a freshly built one (every expert at the setting's bits)."""
  m = compressed_lm_config(experts="codebook", bits=4, group_size=8).model
  float_model, model = float_and_compressed(m)
  compress.compress_model(
    float_model,
    model,
    lambda w: compress.codebook_from_float(w, np.resize(MIXED, len(w["w_gate"])), 8, iterations=5),
  )
  saved = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))
  fresh = float_and_compressed(m)[1]
  target = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(fresh)))
  experts = saved["blocks"][0]["ffn"]["experts"]
  np.testing.assert_array_equal(experts["bits"], np.resize(MIXED, len(experts["bits"])))
  assert np.all(target["blocks"][0]["ffn"]["experts"]["bits"] == 4)
  checkpointer = Checkpointer(str(tmp_path))
  checkpointer.save(1, saved, {}, {})
  checkpointer.close()
  restored, _ = Checkpointer(str(tmp_path), read_only=True).restore(1, target)
  jax.tree.map(np.testing.assert_array_equal, restored, saved)
  nnx.update(fresh, restored)
  for block, want in zip(fresh.blocks, model.blocks):
    jax.tree.map(
      np.testing.assert_array_equal,
      cz.host(block.ffn.experts.arrays()),
      cz.host(want.ffn.experts.arrays()),
    )
