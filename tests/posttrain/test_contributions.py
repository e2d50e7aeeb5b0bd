"""Calibration statistics for pruning (moejax/posttrain/contributions.py) on a
tiny LM, against a per-token numpy loop over each token's routed experts and
against the MoE layer's own output; the output Gram against every expert run on
every token."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.configs import lm_shakespeare_dense, lm_shakespeare_moe
from moejax.errors import ConfigError
from moejax.models.capture import captured_forward
from moejax.posttrain import contributions
from moejax.train.loop import init_state

BATCHES = [
  np.random.default_rng(i).integers(0, 256, size=(2, 16)).astype(np.int32) for i in range(2)
]


@functools.partial(jax.jit, static_argnums=0)
def routing_and_outputs(graphdef, params, rest, tokens):
  """Per MoE block: its input [T, d], routing, and the layer's own output [T, d]."""
  model = nnx.merge(graphdef, params, rest)
  _, aux, outputs = captured_forward(model, tokens)
  blocks = [i for i, b in enumerate(model.blocks) if b.is_moe]
  return [
    (
      outputs[("blocks", i, "ffn_norm", "__call__")].reshape(-1, model.cfg.d_model),
      layer_aux["expert_index"],
      layer_aux["combine_weight"],
      layer_aux["valid"],
      outputs[("blocks", i, "ffn", "__call__")][0].reshape(-1, model.cfg.d_model),
    )
    for i, layer_aux in zip(blocks, aux["moe"])
  ]


def silu(x):
  return x / (1 + np.exp(-x))


def test_statistics_equal_a_per_token_loop_and_sum_to_the_layer_output(tiny_model):
  _, graphdef, state = tiny_model
  params, rest, batches = state.params, state.rest, BATCHES
  stats = contributions.layer_statistics(graphdef, params, rest, batches)
  host = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  assert [s.block for s in stats] == [0, 1]
  for s in stats:
    w = host["blocks"][s.block]["ffn"]["experts"]
    e = w["w_down"].shape[0]
    gram, freq, mass = np.zeros((e, e)), np.zeros(e), np.zeros(e)
    outputs = np.zeros((e, e))  # every expert on every token, routed or not
    for tokens in batches:
      x, index, weight, valid, layer_out = map(
        lambda a: np.asarray(a, np.float64),
        routing_and_outputs(graphdef, params, rest, jnp.asarray(tokens))[[0, 1].index(s.block)],
      )
      for t in range(x.shape[0]):
        every = np.stack(
          [(silu(x[t] @ w["w_gate"][k]) * (x[t] @ w["w_up"][k])) @ w["w_down"][k] for k in range(e)]
        )
        outputs += every @ every.T
        z = np.zeros((e, x.shape[1]))
        for slot in range(index.shape[1]):
          if valid[t, slot]:
            k = int(index[t, slot])
            out = (silu(x[t] @ w["w_gate"][k]) * (x[t] @ w["w_up"][k])) @ w["w_down"][k]
            z[k] += weight[t, slot] * out
            freq[k] += 1
            mass[k] += weight[t, slot]
        gram += z @ z.T
        np.testing.assert_allclose(z.sum(0), layer_out[t], rtol=1e-4, atol=1e-5)
    assert s.tokens == sum(b.size for b in batches)
    np.testing.assert_allclose(s.gram, gram, rtol=1e-4, atol=1e-6 * np.abs(gram).max())
    np.testing.assert_array_equal(s.frequency, freq)
    np.testing.assert_allclose(s.mass, mass, rtol=1e-5)
    np.testing.assert_allclose(s.outputs, outputs, rtol=1e-4, atol=1e-6 * np.abs(outputs).max())
    assert np.all(np.diag(s.outputs) > 0)
    assert freq.sum() == 2 * s.tokens  # top-2, dropless: every slot kept


def test_a_model_without_moe_layers_is_refused():
  graphdef, state, _ = init_state(lm_shakespeare_dense.get_config("size=tiny"))
  with pytest.raises(ConfigError, match="no MoE layer"):
    contributions.layer_statistics(graphdef, state.params, state.rest, BATCHES)


def test_a_router_with_state_is_captured_too():
  """nnx.capture adds `__captures__` to every module, the router-state Dict included
  (sigmoid_bias keeps a bias there): routing reads only its Variables."""
  graphdef, state, _ = init_state(lm_shakespeare_moe.get_config("size=tiny,router=sigmoid_bias"))
  stats = contributions.layer_statistics(graphdef, state.params, state.rest, BATCHES)
  assert all(s.frequency.sum() == 2 * s.tokens for s in stats)
