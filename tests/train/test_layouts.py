"""Checkpoints of the former OmniMoE layer (moejax/train/layouts.py) restore into
the one MoE layer.

The oracle is the former layer's own computation, written with the functions
it called (route_product_key on x @ router_x and x @ router_y with its
bn_stats, atomic_naive on up, down [N, d], plus the shared SwiGLU): on the
old-layout variables it must give the output of today's layer. Then a
workdir holding the old layout and an old config (ffn_type 'omnimoe',
model.omni) restores to the state it was written from, exactly.

Checked once by hand against a workdir the previous code (commit 0f4161c)
trained: load_from_workdir gives its logits with max difference 0.0.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.configs import lm_shakespeare_omnimoe
from moejax.config import base_config
from moejax.experts.atomic import atomic_naive
from moejax.layers.moe import MoELayer
from moejax.routing import router_config
from moejax.routing.product_key import per_axis_k_of, route_product_key
from moejax.train import step as step_lib
from moejax.train.checkpoint import Checkpointer, jsonable
from moejax.train.layouts import OMNIMOE_LAYER
from moejax.train.loop import init_state
from moejax.train.restore import load_from_workdir


def tiny_omnimoe():
  c = lm_shakespeare_omnimoe.get_config("size=tiny")
  c.train.progress_bar = False
  return c


def former_layer(old_params, old_rest, shared, x, cfg, *, train):
  """The former OmniMoELayer's forward on its own variables."""
  stats = {k: jnp.asarray(v) for k, v in old_rest["bn_stats"].items()}
  routing, _, _ = route_product_key(
    x @ old_params["router_x"],
    x @ old_params["router_y"],
    stats,
    top_k=cfg.top_k,
    per_axis_k=per_axis_k_of(router_config("product_key", cfg)),
    train=train,
  )
  return atomic_naive(
    x, old_params["up"], old_params["down"], routing, cfg.atomic.activation
  ) + shared(x)


def test_former_layer_on_old_layout_equals_the_moe_layer():
  cfg = tiny_omnimoe().model.moe
  layer = MoELayer(32, cfg, rngs=nnx.Rngs(3), dtype=jnp.float32)
  _, params, rest = step_lib.split_model(layer)
  # running statistics away from their init, so a swapped x/y would show
  rest["router_state"] = {k: v + np.arange(len(v)) / 7 for k, v in rest["router_state"].items()}
  old_params, old_rest = OMNIMOE_LAYER.to_old(params), OMNIMOE_LAYER.to_old(rest)
  assert set(old_params) == {"router_x", "router_y", "up", "down", "shared"}
  assert old_params["up"].shape == (cfg.num_experts, 32) and set(old_rest) == {"bn_stats"}
  x = jax.random.normal(jax.random.key(0), (2, 7, 32))
  graphdef, _, _ = step_lib.split_model(layer)
  for train in (False, True):
    y, _ = nnx.merge(graphdef, params, rest)(x, train=train)
    want = former_layer(old_params, old_rest, layer.shared, x.reshape(14, 32), cfg, train=train)
    np.testing.assert_allclose(y.reshape(14, 32), want, rtol=1e-6, atol=1e-6)
  back = OMNIMOE_LAYER.to_new(old_params)
  jax.tree.map(np.testing.assert_array_equal, back, params)


def test_old_omnimoe_workdir_restores_exactly(tmp_path):
  config = tiny_omnimoe()
  _, state, _ = init_state(config)
  state = state.replace(step=np.int32(5), rest=jax.tree.map(lambda v: v + 0.25, state.rest))
  e = config.model.moe
  old = base_config()  # the old OmniMoE config: the default MoE section, ffn_type, model.omni
  old.model.update(
    dict(
      d_model=config.model.d_model,
      num_layers=config.model.num_layers,
      num_heads=config.model.num_heads,
      num_kv_heads=config.model.num_kv_heads,
      head_dim=config.model.head_dim,
      d_ff=config.model.d_ff,
    )
  )
  old_dict = old.to_dict()
  old_dict["model"]["ffn_type"] = "omnimoe"
  old_dict["model"]["omni"] = dict(
    num_atomic_experts=e.num_experts,
    top_k=e.top_k,
    per_axis_k=0,
    shared_d_ff=e.shared.d_ff,
    activation="silu",
    schedule="naive",
    grouped_matmul="tiled",
    tile=8,
    block_rows=512,
  )
  ckpt = Checkpointer(str(tmp_path))
  ckpt.save(
    5, OMNIMOE_LAYER.to_old(jax.tree.map(np.asarray, state)), {}, {"config": jsonable(old_dict)}
  )
  ckpt.wait()
  ckpt.close()
  restored, graphdef, params, rest, _ = load_from_workdir(str(tmp_path))
  assert restored.model.moe.router == "product_key" and restored.model.ffn_type == "moe"
  jax.tree.map(np.testing.assert_array_equal, params, state.params)
  jax.tree.map(np.testing.assert_array_equal, rest, state.rest)
