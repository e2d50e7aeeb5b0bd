"""Shared by the tests of the compressed expert types (test_quantized.py,
test_codebook_experts.py): float experts and their float64 SwiGLU, the tiny LM
config with compressed experts, and the LM-level checks both types run."""

import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax.configs import lm_shakespeare_moe
from moejax.models import Decoder
from moejax.posttrain import compress

E, D, F = 4, 32, 16  # experts, d_model, expert_d_ff of the layer-level tests


def float_weights(seed=0, num_experts=E):
  """SwiGLU expert weights {w_gate, w_up [E, D, F], w_down [E, F, D]}, float32."""
  rng = np.random.default_rng(seed)
  shapes = {"w_gate": (D, F), "w_up": (D, F), "w_down": (F, D)}
  return {
    m: (rng.standard_normal((num_experts, *s)) / np.sqrt(s[0])).astype(np.float32)
    for m, s in shapes.items()
  }


def swiglu64(w, e, x):
  """Expert e of weights w on rows x, numpy float64."""
  x = np.asarray(x, np.float64)
  gate = x @ w["w_gate"][e]
  return (gate / (1 + np.exp(-gate)) * (x @ w["w_up"][e])) @ w["w_down"][e]


def relative(got, want):
  """max |got - want| / max |want|."""
  return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def compressed_lm_config(data_dir=None, experts="quantized", **settings):
  """The tiny LM with `experts` (group_size 16 unless set); 2 steps, checkpointed."""
  c = lm_shakespeare_moe.get_config("size=tiny")
  c.model.moe.experts = experts
  c.model.moe[experts].update({"group_size": 16, **settings})
  if data_dir is not None:
    c.data.data_dir = data_dir
  c.train.steps, c.train.checkpoint_every, c.train.eval_batches = 2, 2, 1
  c.train.progress_bar = False
  return c


def equals_swiglu_model_on_dense_weights(m, dense, shape=(2, 16)):
  """The compressed LM's logits on random tokens [shape] equal a swiglu LM's whose
  experts hold `dense` (layer weights -> {w_gate, w_up, w_down}), every other
  parameter shared."""
  float_model, model = float_and_compressed(m)
  nnx.update(float_model, nnx.state(model, nnx.Param))
  for block, float_block in zip(model.blocks, float_model.blocks):
    for name, w in dense(block.ffn.experts.weights(jnp.float32)).items():
      getattr(float_block.ffn.experts, name).set_value(w)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, m.vocab_size, shape))
  got, want = model(tokens)[0], float_model(tokens)[0]
  np.testing.assert_allclose(got, want, atol=1e-5 * float(jnp.abs(want).max()), rtol=0)


def float_and_compressed(m):
  """(swiglu LM, LM with m's compressed experts): the same seed, so every
  parameter outside the experts is equal."""
  float_m = ml_collections.ConfigDict(m.to_dict())
  float_m.moe.experts = "swiglu"

  def build(c):
    return Decoder(ml_collections.FrozenConfigDict(c), rngs=nnx.Rngs(0))

  return build(float_m), build(m)


def compressed_lm_error(m, convert) -> float:
  """Max |logits| error / max |logits| of the float tiny LM compressed by
  compress.compress_model(float, compressed, convert). Router kernels are scaled
  up 30x first: at init the routing is near a tie, and one token whose top-k
  flips under a 1e-3 weight change would dominate the maximum."""
  float_model, model = float_and_compressed(m)
  for path, variable in nnx.iter_graph(float_model):
    if isinstance(variable, nnx.Param) and "router_kernel" in path:
      variable.set_value(30 * variable[...])
  compress.compress_model(float_model, model, convert)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, m.vocab_size, (2, 16)))
  want = np.asarray(float_model(tokens)[0], np.float64)
  return float(np.max(np.abs(np.asarray(model(tokens)[0]) - want)) / np.max(np.abs(want)))
