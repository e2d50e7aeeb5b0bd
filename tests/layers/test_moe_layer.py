"""The MoE layer end to end: finite-difference gradients, loss closed forms,
shared experts, and causality of the whole LM."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

from moejax.config import base_config
from moejax.layers.moe import MoELayer
from moejax.losses.balance import load_balance_loss, router_z_loss
from moejax.models import Decoder
from moejax.routing import Routing, RouterOutput
from tests.helpers import moe_cfg

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


@pytest.mark.parametrize(
  "router,dispatch",
  [
    ("topk", "dropless"),
    ("topk", "capacity"),
    ("sigmoid_bias", "dropless"),
    ("expert_choice", "dropless"),
  ],
)
def test_moe_layer_gradients_match_finite_differences(router, dispatch):
  """Reverse-mode gradients of loss(x, params) equal central differences (float64)."""
  with jax.enable_x64(True):
    cfg = moe_cfg(
      router=router,
      dispatch=dispatch,
      num_experts=4,
      top_k=2,
      expert_d_ff=6,
      shared={"count": 1, "d_ff": 5},
      capacity={"factor": 4.0},
      loss_weights={"load_balance": 0.1, "z_loss": 0.01},
    )
    layer = MoELayer(8, cfg, rngs=nnx.Rngs(0), dtype=jnp.float64)
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
    params = jax.tree.map(lambda p: p.astype(jnp.float64), nnx.to_pure_dict(params))
    rest = nnx.to_pure_dict(rest)
    x = jax.random.normal(jax.random.key(1), (2, 5, 8), jnp.float64)
    proj = jax.random.normal(jax.random.key(2), (2, 5, 8), jnp.float64)

    @jax.jit  # one compilation instead of op-by-op dispatch of every call
    def loss(x, params):
      y, aux = nnx.merge(graphdef, params, rest)(x, train=False)
      return jnp.sum(y * proj) + aux["aux_loss"]

    check_grads(loss, (x, params), order=1, modes=["rev"], eps=1e-6, atol=1e-6, rtol=1e-6)


def test_load_balance_loss_closed_form():
  # 4 tokens, 2 experts, top-1: tokens 0-2 -> expert 0, token 3 -> expert 1.
  probs = jnp.array([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
  routing = Routing(
    jnp.array([[0], [0], [0], [1]], jnp.int32), probs.max(1, keepdims=True), jnp.ones((4, 1), bool)
  )
  out = RouterOutput(routing, jnp.log(probs), probs, {}, {})
  f = np.array([0.75, 0.25])
  p = np.array([2.6, 1.4]) / 4
  np.testing.assert_allclose(load_balance_loss(out), 2 * (f * p).sum(), rtol=1e-6)
  # Perfect balance with uniform probabilities gives exactly 1.
  uniform = jnp.full((4, 2), 0.5)
  balanced = Routing(
    jnp.array([[0], [1], [0], [1]], jnp.int32), uniform[:, :1], jnp.ones((4, 1), bool)
  )
  np.testing.assert_allclose(
    load_balance_loss(RouterOutput(balanced, uniform, uniform, {}, {})), 1.0
  )


def test_z_loss_closed_form():
  logits = jnp.array([[0.0, 0.0], [1.0, 2.0]])
  expected = (math.log(2) ** 2 + math.log(math.e + math.e**2) ** 2) / 2
  out = RouterOutput(None, logits, None, {}, {})
  np.testing.assert_allclose(router_z_loss(out), expected, rtol=1e-6)


def test_shared_expert_is_added_to_routed_output():
  cfg = moe_cfg(num_experts=4, top_k=1, expert_d_ff=6, shared={"count": 2, "d_ff": 3})
  layer = MoELayer(8, cfg, rngs=nnx.Rngs(0), dtype=jnp.float32)
  x = jax.random.normal(jax.random.key(0), (1, 4, 8))
  y, _ = layer(x)
  shared_only = layer.shared(x.reshape(4, 8)).reshape(1, 4, 8)
  assert layer.shared.gate.kernel.shape == (8, 6)  # 2 shared experts of width 3
  layer.shared = nnx.data(None)
  y_routed, _ = layer(x)
  np.testing.assert_allclose(y, y_routed + shared_only, rtol=1e-5, atol=1e-6)


def tiny_model_cfg(**moe):
  c = base_config().model
  c.d_model, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.d_ff = 16, 2, 2, 1, 8, 32
  c.moe.expert_d_ff = 16
  c.moe.update(moe)  # a dict for a section changes only the keys it names
  return ml_collections.FrozenConfigDict(c)


@pytest.mark.parametrize(
  "router,dispatch", [("topk", "dropless"), ("sigmoid_bias", "dropless"), ("topk", "capacity")]
)
def test_changing_token_t_changes_no_earlier_logit(router, dispatch):
  # capacity.factor 8 = E/k * 2: no drops, so capacity routing is per-token too.
  cfg = tiny_model_cfg(router=router, dispatch=dispatch, capacity={"factor": 8.0})
  model = jitted_logits(Decoder(cfg, rngs=nnx.Rngs(0)))
  tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, 256)
  logits = model(tokens)
  for t in (0, 5, 11):
    changed = tokens.at[:, t].set((tokens[:, t] + 17) % 256)
    logits2 = model(changed)
    np.testing.assert_array_equal(logits[:, :t], logits2[:, :t])
    assert not np.allclose(logits[:, t:], logits2[:, t:])


def jitted_logits(model):
  """tokens -> logits of `model` (eval), compiled once for all calls of a test."""
  graphdef, state = nnx.split(model)
  return jax.jit(lambda tokens: nnx.merge(graphdef, state)(tokens)[0])


def test_expert_choice_is_flagged_and_is_non_causal():
  decoder = Decoder(tiny_model_cfg(router="expert_choice"), rngs=nnx.Rngs(0))
  assert not decoder.blocks[0].ffn.router_spec.causal
  model = jitted_logits(decoder)
  tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, 256)
  logits = model(tokens)
  differs = []
  for seed in range(4):  # some later change must move an earlier logit
    changed = tokens.at[:, 8:].set(jax.random.randint(jax.random.key(seed), (2, 4), 0, 256))
    differs.append(not np.array_equal(model(changed)[:, :8], logits[:, :8]))
  assert any(differs)


def test_bfloat16_compute_keeps_router_in_float32():
  """With model.dtype=bfloat16 the experts run in bf16 and the router in float32."""
  cfg = moe_cfg(num_experts=4, top_k=2, expert_d_ff=16)
  layer = MoELayer(8, cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
  x = jax.random.normal(jax.random.key(0), (2, 6, 8)).astype(jnp.bfloat16)
  jaxpr = jax.make_jaxpr(lambda x: layer(x))(x).jaxpr
  dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
  router_dots = [e for e in dots if e.outvars[0].aval.shape == (12, 4)]
  assert router_dots and all(e.outvars[0].aval.dtype == jnp.float32 for e in router_dots)
  # The expert weights [E, d, f] enter the expert compute (whatever primitive
  # the grouped matmul lowers to: dot_general or a custom_vjp kernel) in bf16.
  weight_inputs = [
    v.aval.dtype
    for e in jaxpr.eqns
    if e.primitive.name != "convert_element_type"
    for v in e.invars
    if getattr(v, "aval", None) is not None and v.aval.shape == (4, 8, 16)
  ]
  assert weight_inputs and all(dtype == jnp.bfloat16 for dtype in weight_inputs)
  y, aux = layer(x)
  assert y.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))
  assert aux["aux_loss"].dtype == jnp.float32


def test_router_trained_parameters_get_gradients():
  """SmoothSMoE's band eta is a router parameter (init_params): the layer holds it
  as an nnx.Param and the boundary loss + routing weights give it a gradient."""
  cfg = moe_cfg(
    router="smooth_topk",
    num_experts=6,
    top_k=2,
    expert_d_ff=8,
    smooth_topk=dict(eta_init=0.5),
    loss_weights={"smooth_boundary": 1.0},
  )
  layer = MoELayer(8, cfg, rngs=nnx.Rngs(0), dtype=jnp.float32)
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  params = nnx.to_pure_dict(params)
  assert "eta_offset" in params["router_params"]
  x = jax.random.normal(jax.random.key(1), (2, 16, 8))

  def loss(params):
    y, aux = nnx.merge(graphdef, params, nnx.to_pure_dict(rest))(
      x, train=True, rng=jax.random.key(0)
    )
    return jnp.sum(y**2) + aux["aux_loss"]

  grad = jax.jit(jax.grad(loss))(params)["router_params"]["eta_offset"]
  assert np.isfinite(float(grad)) and abs(float(grad)) > 0


def test_dpsl_reads_its_prior_from_the_config():
  """The layer parses model.moe.losses.dpsl once, into the LossConfig the loss receives."""
  from moejax.losses import get_loss
  from moejax.losses.dpsl import dpsl_loss

  cfg = moe_cfg(num_experts=4, loss_weights={"dpsl": 1e-2}, losses=dict(dpsl=dict(alpha=0.5)))
  layer = MoELayer(8, cfg, rngs=nnx.Rngs(0), dtype=jnp.float32)
  assert sorted(layer.loss_configs) == ["dpsl", "load_balance", "z_loss"]
  probs = jax.nn.softmax(jax.random.normal(jax.random.key(0), (32, 4)), -1)
  out = RouterOutput(None, jnp.log(probs), probs, {}, {})
  np.testing.assert_allclose(
    get_loss("dpsl")(out, layer.loss_configs["dpsl"]), dpsl_loss(probs, 0.5), rtol=1e-6
  )
  assert not np.isclose(dpsl_loss(probs, 0.5), dpsl_loss(probs, 1.0))


def test_parsed_configs_are_static_and_survive_split_merge_and_jit():
  """RouterConfig, LossConfigs and expert settings are parsed once at build: static
  (graph definition, hashable), no part of the state, the same after split/merge."""
  cfg = moe_cfg(router="sere", num_experts=4, top_k=2, sere=dict(rho=0.25))
  layer = MoELayer(8, cfg, rngs=nnx.Rngs(0), dtype=jnp.float32)
  assert layer.router_config.settings["rho"] == 0.25 and layer.router_config.top_k == 2
  graphdef, state = nnx.split(layer)
  hash(graphdef)  # static attributes must hash (jit caches on the graph definition)
  paths = {".".join(map(str, path)) for path, _ in nnx.to_flat_state(state)}
  assert not any("config" in path or "settings" in path for path in paths), paths
  again = nnx.merge(graphdef, state)
  assert again.router_config == layer.router_config
  assert again.loss_configs == layer.loss_configs
  assert again.expert_settings == layer.expert_settings
  x = jax.random.normal(jax.random.key(1), (2, 3, 8))
  y, _ = nnx.jit(lambda m, x: m(x))(again, x)
  np.testing.assert_allclose(y, layer(x)[0], rtol=1e-6, atol=1e-6)
