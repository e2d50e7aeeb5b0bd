"""The tiny LM that the super-expert tests profile and ablate
(tests/analysis/test_super_experts.py, test_super_expert_ablation.py; fixture
`sink_lm` in tests/analysis/conftest.py) and the compiled forward they read."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.models.capture import captured_forward
from moejax.train.loop import init_state

SINK_TOKEN = 0


def sink_lm(tiny_config):
  """A tiny MoE LM with q/k/v biases (zero at init) and rows that start with
  SINK_TOKEN, which appears nowhere else: (config, graphdef, params, rest, tokens)."""
  config = tiny_config(model={"attention.qkv_bias": True})
  graphdef, state, _ = init_state(config)
  tokens = np.random.default_rng(0).integers(1, 256, size=(4, 12)).astype(np.int32)
  tokens[:, 0] = SINK_TOKEN
  return config, graphdef, state.params, state.rest, jnp.asarray(tokens)


def copy(params):
  return jax.tree.map(lambda v: v, params)


@functools.partial(jax.jit, static_argnums=0)
def captured(graphdef, params, rest, tokens):
  """One compiled forward: per block its MoE input [T, d], q and k projections and
  residual output h, per MoE layer its combine weights [T, S], and per MoE layer
  the routing (expert_index, valid)."""
  model = nnx.merge(graphdef, params, rest)
  _, aux, outputs = captured_forward(model, tokens)
  blocks = range(len(model.blocks))
  values = {
    name: [outputs[("blocks", i, *path, "__call__")] for i in blocks]
    for name, path in (("x", ("ffn_norm",)), ("q", ("attn", "q")), ("k", ("attn", "k")))
  }
  values["h"] = [outputs[("blocks", i, "__call__")][0] for i in blocks]
  values["weight"] = [a["combine_weight"] for a in aux["moe"]]
  return values, [(a["expert_index"], a["valid"]) for a in aux["moe"]]


def swiglu_numpy(w, e, x):
  """Expert e of the SwiGLU weights w (numpy float64) on rows x [n, d]."""
  gate = x @ w["w_gate"][e]
  return (gate / (1 + np.exp(-gate)) * (x @ w["w_up"][e])) @ w["w_down"][e]
