"""Checkpoints of older variable layouts (moejax/train/layouts.py) restore into
today's model: the former OmniMoE layer into the one MoE layer, and L3 tables saved
after the blocks (a top-level `lookups`) into the blocks that end with them.

The oracle is the former layer's own computation, written with the functions
it called (route_product_key on x @ router_x and x @ router_y with its
bn_stats, atomic_naive on up, down [N, d], plus the shared SwiGLU): on the
old-layout variables it must give the output of today's layer. Then a
workdir holding the old layout and an old config (ffn_type 'omnimoe',
model.omni) restores to the state it was written from, exactly.

Checked once by hand against a workdir the previous code (commit 0f4161c)
trained: load_from_workdir gives its logits with max difference 0.0. The same for
an L3 workdir (layers 0 and 1) that the code before the move (commit fdbbdd6)
trained: logits max difference 0.0.

For L3 the oracle is the old model's computation written out: block i, then its
table's lookup (l3_lookup + l3_mix, the functions the old Decoder called) on the
old-layout variables; and an old-layout workdir, optimizer moments included,
restores exactly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.configs import lm_shakespeare_l3, lm_shakespeare_omnimoe
from moejax.config import base_config
from moejax.experts.atomic import atomic_naive
from moejax.layers.moe import MoELayer
from moejax.routing import router_config
from moejax.routing.product_key import per_axis_k_of, route_product_key
from moejax.train import step as step_lib
from moejax.train.checkpoint import Checkpointer, jsonable
from moejax.layers.lookup import PARAM_NAMES, l3_lookup, l3_mix
from moejax.train.layouts import L3_AFTER_BLOCKS, OMNIMOE_LAYER
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


def tiny_l3():
  c = lm_shakespeare_l3.get_config("size=tiny,l3_layers=0+1,allocation=uniform")
  c.train.progress_bar = False
  return c


@pytest.mark.integration
def test_old_l3_layout_computes_what_the_model_computes():
  """Block by block on the old layout: block i without its table, then the table's
  lookup as the old Decoder applied it, equals today's model (the table in the block)."""
  config = tiny_l3()
  graphdef, state, _ = init_state(config)
  params, rest = state.params, state.rest
  old_params, old_rest = L3_AFTER_BLOCKS.to_old(params), L3_AFTER_BLOCKS.to_old(rest)
  assert set(old_params["lookups"]) == {"0", "1"} and "blocks" not in old_rest
  assert all("lookup" not in block for block in old_params["blocks"].values())
  model = nnx.merge(graphdef, params, rest)
  tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, 256)
  want, _, _ = model(tokens)
  x = model.embed[...][tokens]
  b, length = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(length), (b, length))
  allowed = jnp.tril(jnp.ones((length, length), bool))[None]
  for i, block in enumerate(model.blocks):
    lookup, block.lookup = block.lookup, None  # the block as it was: no table inside
    x, _, _ = block(x, positions, allowed, None, None, 0, train=False, rng=jax.random.key(0))
    block.lookup = lookup
    table, layout = old_params["lookups"][str(i)], old_rest["lookups"][str(i)]
    x_hat = lookup.norm(x)
    pooled = l3_lookup(
      table, layout["offsets"], layout["lengths"], tokens, x_hat, max_len=lookup.max_len
    )
    x = x + l3_mix({k: table[k] for k in PARAM_NAMES}, x_hat, pooled)
  got = model.output_projection(model.final_norm(x))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  jax.tree.map(np.testing.assert_array_equal, L3_AFTER_BLOCKS.to_new(old_params), params)
  jax.tree.map(np.testing.assert_array_equal, L3_AFTER_BLOCKS.to_new(old_rest), rest)


def test_old_l3_workdir_restores_exactly(tmp_path):
  config = tiny_l3()
  _, state, _ = init_state(config)
  state = jax.tree.map(np.asarray, state)
  moments = jax.tree.map(lambda v: v + 0.5 if v.dtype == np.float32 else v, state.opt_state)
  state = state.replace(step=np.int32(3), opt_state=moments)
  ckpt = Checkpointer(str(tmp_path))
  ckpt.save(3, L3_AFTER_BLOCKS.to_old(state), {}, {"config": jsonable(config.to_dict())})
  ckpt.wait()
  ckpt.close()
  stored = Checkpointer(str(tmp_path)).stored_tree(3)
  assert "lookups" in stored["params"] and "lookups" in stored["rest"]
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), state)
  restored, _ = Checkpointer(str(tmp_path)).restore(3, target)
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  _, _, params, rest, _ = load_from_workdir(str(tmp_path))
  np.testing.assert_array_equal(
    params["blocks"][1]["lookup"]["keys"], state.params["blocks"][1]["lookup"]["keys"]
  )
  np.testing.assert_array_equal(
    rest["blocks"][0]["lookup"]["lengths"], state.rest["blocks"][0]["lookup"]["lengths"]
  )
