"""Inference-time router tooling on a (randomly initialised) tiny LM: teacher-forced
decoding equals the full forward, calibration captures the true MoE inputs and
finds duplicated experts, router swaps keep the weights."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lm_shakespeare_moe
from moejax.analysis import router_inference as ri
from moejax.errors import ConfigError
from moejax.train.loop import init_state
from moejax.train.step import cross_entropy


@pytest.fixture(scope="module")
def tiny():
  config = lm_shakespeare_moe.get_config("size=tiny")
  graphdef, state, _ = init_state(config)
  rng = np.random.default_rng(0)
  windows = rng.integers(0, 256, size=(8, 13)).astype(np.int32)
  return config, graphdef, state.params, state.rest, windows


def full_forward_bpb(graphdef, params, rest, windows):
  batch = {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
  loss, _ = ri._forward(graphdef, params, rest, batch["inputs"], batch["targets"])
  return float(loss) / math.log(2)


def test_teacher_forced_decoding_equals_the_full_forward(tiny):
  config, graphdef, params, rest, windows = tiny
  m = config.model
  for batch in (2, 8):  # top-k routing does not depend on the decode batch
    out = ri.decode_score(m, params, rest, windows, batch)
    assert out["bpb"] == pytest.approx(full_forward_bpb(graphdef, params, rest, windows),
                                       rel=1e-5)
    assert 1 <= out["distinct_experts"] <= min(8, 2 * batch)


def test_score_batches_reports_loss_and_top_k_load(tiny):
  config, graphdef, params, rest, windows = tiny
  batch = {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
  out = ri.score_batches(graphdef, params, rest, [batch], top_k=2)
  assert out["bpb"] == pytest.approx(full_forward_bpb(graphdef, params, rest, windows), rel=1e-6)
  assert out["experts_per_token"] == pytest.approx(2.0) and out["kept_fraction"] == 1.0
  # gamma large: capacity-aware drop is top-k; gamma small: max load = C exactly.
  _, loose = ri.with_router(config, router="capacity_aware",
                             capacity_aware=dict(gamma=100.0))
  assert ri.score_batches(loose, params, rest, [batch], 2)["bpb"] == pytest.approx(out["bpb"])
  _, tight = ri.with_router(config, router="capacity_aware",
                             capacity_aware=dict(gamma=0.5))
  drop = ri.score_batches(tight, params, rest, [batch], 2)
  capacity = math.ceil(0.5 * 2 * windows[:, :-1].size / config.model.moe.num_experts)
  assert drop["max_load"] <= capacity + 1e-6 and drop["kept_fraction"] < 1.0


def test_calibration_captures_moe_inputs_and_finds_duplicate_experts(tiny):
  config, graphdef, params, rest, windows = tiny
  from flax import nnx
  model = nnx.merge(graphdef, params, rest)
  inputs = ri.moe_layer_inputs(model, jnp.asarray(windows[:, :-1]))
  assert len(inputs) == config.model.num_layers
  # Oracle for the first layer's input: ffn_norm(x + attn(attn_norm(x))) by hand.
  block, x = model.blocks[0], model.embed[...][windows[:, :-1]]
  positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
  causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))[None]
  attended, _ = block.attn(block.attn_norm(x), positions, causal)
  by_hand = block.ffn_norm(x + attended)
  np.testing.assert_allclose(inputs[0], by_hand.reshape(-1, x.shape[-1]), rtol=1e-6, atol=1e-6)
  # Make expert 3 a copy of expert 1 in every layer: CKA(1, 3) = 1, others < 1.
  params = jax.tree.map(lambda v: v, params)
  for block_params in params["blocks"].values():
    for name in ("w_gate", "w_up", "w_down"):
      w = block_params["ffn"]["experts"][name]
      block_params["ffn"]["experts"][name] = w.at[3].set(w[1])
  sim = np.asarray(ri.calibrate_similarity(graphdef, params, rest, jnp.asarray(windows)))
  assert sim.shape == (config.model.num_layers, 8, 8)
  np.testing.assert_allclose(sim[:, 1, 3], 1.0, rtol=1e-5)
  np.testing.assert_allclose(sim, np.swapaxes(sim, 1, 2), atol=1e-6)
  np.testing.assert_allclose(np.diagonal(sim, axis1=1, axis2=2), 1.0, rtol=1e-5)
  off = sim[:, ~np.eye(8, dtype=bool)]
  assert np.sum(off > 1 - 1e-4) == 2 * config.model.num_layers  # (1,3) and (3,1) only


def test_set_router_state_writes_each_layer_and_checks_the_count():
  eye = np.eye(2, dtype=np.float32)
  rest = {"layers": {i: {"moe": {"expert_similarity": eye}} for i in (0, 2, 10)}}
  rest["layers"][1] = {"attn": {}}
  values = [np.full((2, 2), v, np.float32) for v in (0.1, 0.2, 0.3)]
  out = ri.set_router_state(rest, "expert_similarity", values)
  for layer, v in zip((0, 2, 10), (0.1, 0.2, 0.3)):  # numeric layer order, not "10" < "2"
    assert float(out["layers"][layer]["moe"]["expert_similarity"][0, 1]) == pytest.approx(v)
  assert float(rest["layers"][0]["moe"]["expert_similarity"][0, 1]) == 0.0  # copy
  with pytest.raises(ConfigError, match="3 router states"):
    ri.set_router_state(rest, "expert_similarity", [eye])
  with pytest.raises(ConfigError, match=r"shape \(2, 2\); the value given has \(3, 3\)"):
    ri.set_router_state(rest, "expert_similarity", [np.eye(3)] * 3)


def test_sere_decoding_with_a_threshold_above_every_similarity_is_top_k(tiny):
  config, graphdef, params, rest, windows = tiny
  m = config.model
  similarity = ri.calibrate_similarity(graphdef, params, rest, jnp.asarray(windows))
  plain = ri.decode_score(m, params, rest, windows, 8)
  m_off, rest_off = ri.with_sere(m, rest, similarity, rho=1.5)
  assert ri.decode_score(m_off, params, rest_off, windows, 8) == plain
  m_on, rest_on = ri.with_sere(m, rest, similarity, rho=0.0)
  rerouted = ri.decode_score(m_on, params, rest_on, windows, 8)
  assert rerouted["distinct_experts"] < plain["distinct_experts"]
