"""The model the routing attribution tests decompose (tests/analysis/
test_routing_attribution.py, test_routing_paths.py) and the tokens they run it on."""

import jax
import jax.numpy as jnp
import numpy as np

from moejax.configs import lm_shakespeare_moe
from moejax.train.loop import init_state


def model(**moe):
  """Three blocks: a dense FFN, then two MoE blocks with a gated shared expert;
  attention with q/k/v and output biases (set non-zero below)."""
  c = lm_shakespeare_moe.get_config("size=tiny,shared=1")
  c.model.num_layers, c.model.moe.first_dense = 3, 1
  c.model.moe.shared.gate = True
  c.model.attention.qkv_bias = c.model.attention.out_bias = True
  for key, value in moe.items():
    c.model.moe[key] = value
  graphdef, state, _ = init_state(c)
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(
    lambda path, v: (
      jnp.asarray(rng.normal(size=v.shape) * 0.1, v.dtype) if "bias" in str(path[-1]) else v
    ),
    state.params,
  )
  return graphdef, params, state.rest


TOKENS = np.random.default_rng(1).integers(0, 256, size=(2, 12)).astype(np.int32)
