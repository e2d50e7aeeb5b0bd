"""OmniMoE (arXiv 2602.05711) as the one MoE layer with router product_key and
atomic experts: product-key search == brute force, expert-centric == naive
gather == a float64 per-token loop, bad config keys, stored configs of the
former OmniMoE layer, and a tiny LM that learns."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings, strategies as st

from moejax.configs import lm_shakespeare_omnimoe
from moejax.config import apply_size, base_config
from moejax.migrate import with_defaults
from moejax.validation import validate_config, validate_moe
from moejax.errors import ConfigError
from moejax.experts.atomic import atomic_naive
from moejax.layers.moe import MoELayer
from moejax.routing.base import Routing
from moejax.routing.product_key import product_key_top_k, route_product_key
from moejax.train import step as step_lib
from moejax.train.loop import train_and_evaluate
from tests.helpers import set_key

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

# (n, per-axis k >= min(top_k, n), top_k <= n^2, tokens, seed); few shapes, many contents.
grids = st.sampled_from([1, 2, 3, 5, 8]).flatmap(
  lambda n: st.integers(1, n * n).flatmap(
    lambda k: st.tuples(
      st.just(n),
      st.integers(min(k, n), n),
      st.just(k),
      st.sampled_from([1, 7]),
      st.integers(0, 2**16),
    )
  )
)


def brute_force(lp_x, lp_y, k):
  """Top-k of all N = n^2 sums (float32, as the router adds), flat index i * n + j."""
  scores = (lp_x[:, :, None] + lp_y[:, None, :]).reshape(len(lp_x), -1)
  index = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, index, 1), index


@settings(max_examples=20)  # each new shape compiles (suite budget)
@given(grids)
def test_product_key_top_k_is_the_brute_force_top_k(grid):
  n, a, k, t, seed = grid
  rng = np.random.default_rng(seed)
  lp_x, lp_y = (rng.standard_normal((2, t, n)) * 3).astype(np.float32)
  score, index = map(np.asarray, product_key_top_k(jnp.asarray(lp_x), jnp.asarray(lp_y), k, a))
  want_score, want_index = brute_force(lp_x, lp_y, k)
  for got, want in zip(index.tolist(), want_index.tolist()):
    assert sorted(got) == sorted(want)
  np.testing.assert_array_equal(score, want_score)  # best first, bit-exact sums


@settings(max_examples=15)  # each new shape compiles (suite budget)
@given(grids, st.booleans())
def test_router_weights_are_product_probabilities(grid, train):
  n, a, k, t, seed = grid
  rng = np.random.default_rng(seed)
  z_x, z_y = rng.standard_normal((2, t, n)).astype(np.float32)
  stats = {
    "mean_x": rng.standard_normal(n).astype(np.float32),
    "var_x": np.full(n, 2.0, np.float32),
    "mean_y": np.zeros(n, np.float32),
    "var_y": np.ones(n, np.float32),
  }
  routing, _, new = route_product_key(
    jnp.asarray(z_x), jnp.asarray(z_y), stats, top_k=k, per_axis_k=a, train=train
  )

  def log_probs(z, mean, var):
    if train:  # batch statistics (biased variance)
      mean, var = z.mean(0), z.var(0)
    zn = (z.astype(np.float64) - mean) / np.sqrt(var + 1e-5)
    return zn - np.log(np.exp(zn).sum(-1, keepdims=True))

  lp_x, lp_y = (
    log_probs(z_x, stats["mean_x"], stats["var_x"]),
    log_probs(z_y, stats["mean_y"], stats["var_y"]),
  )
  want_score, want_index = brute_force(lp_x, lp_y, k)
  np.testing.assert_array_equal(np.sort(routing.expert_index, 1), np.sort(want_index, 1))
  np.testing.assert_allclose(routing.combine_weight, np.exp(want_score), rtol=1e-5, atol=1e-7)
  if train and t > 1:
    np.testing.assert_allclose(
      new["mean_x"], 0.9 * stats["mean_x"] + 0.1 * z_x.mean(0), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(new["var_y"], 0.9 + 0.1 * z_y.var(0, ddof=1), rtol=1e-5)
  elif not train:
    assert all(new[key] is stats[key] for key in stats)


def random_routing(seed, t, num_experts, k):
  rng = np.random.default_rng(seed)
  index = np.stack([rng.choice(num_experts, k, replace=False) for _ in range(t)])
  return Routing(
    jnp.asarray(index, jnp.int32),
    jnp.asarray(rng.uniform(0.05, 1, (t, k)), jnp.float32),
    jnp.ones((t, k), bool),
  )


@pytest.mark.parametrize("activation", ["silu", "relu"])
def test_naive_gather_equals_a_float64_per_token_loop(activation):
  t, d, num_experts, k = 9, 6, 16, 4
  rng = np.random.default_rng(0)
  x, u, dn = (
    rng.standard_normal(s).astype(np.float32) for s in ((t, d), (num_experts, d), (num_experts, d))
  )
  routing = random_routing(1, t, num_experts, k)
  y = atomic_naive(jnp.asarray(x), jnp.asarray(u), jnp.asarray(dn), routing, activation)
  act = {"silu": lambda v: v / (1 + math.exp(-v)), "relu": lambda v: max(v, 0.0)}[activation]
  want = np.zeros((t, d))
  for i in range(t):
    for e, w in zip(
      np.asarray(routing.expert_index[i]), np.asarray(routing.combine_weight[i], np.float64)
    ):
      want[i] += (
        w * act(float(u[e].astype(np.float64) @ x[i].astype(np.float64))) * dn[e].astype(np.float64)
      )
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def omni_layer_cfg(activation="silu", **overrides):
  """The OmniMoE MoE section at n = 4 (16 atomic experts), top-3, d = 8."""
  c = lm_shakespeare_omnimoe.get_config("size=tiny").model.moe
  c.update(dict(num_experts=16, top_k=3, shared={"d_ff": 8}, dropless={"block": 8}))
  c.update(overrides)
  c.atomic.activation = activation
  validate_moe(c, num_layers=2)
  return ml_collections.FrozenConfigDict(c)


@pytest.mark.parametrize(
  "matmul,tile,act", [("tiled", 8, "silu"), ("tiled", 1, "gelu"), ("loop", 4, "relu")]
)
def test_expert_centric_layer_equals_naive_forward_and_gradients(matmul, tile, act):
  """The one MoE layer with the product_key router: the paper's expert-centric
  schedule (dropless, grouped matmul) and the naive gather ('fused') give the
  same output and the same gradients, router projection included."""
  x = jax.random.normal(jax.random.key(1), (2, 5, 8))
  cot = jax.random.normal(jax.random.key(2), (2, 5, 8))

  def run(matmul, tile):
    cfg = omni_layer_cfg(act, grouped_matmul=matmul, dropless={"tile": tile})
    layer = MoELayer(8, cfg, rngs=nnx.Rngs(0), dtype=jnp.float32)
    graphdef, params, rest = step_lib.split_model(layer)

    def loss(params, x, rest):
      y, aux = nnx.merge(graphdef, params, rest)(x, train=True)
      return jnp.sum(y * cot), (y, aux["aux_loss"])

    return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x, rest)

  (g_naive, (y_naive, aux)), (g_ec, (y_ec, _)) = run("fused", 8), run(matmul, tile)
  np.testing.assert_allclose(y_ec, y_naive, rtol=1e-5, atol=1e-6)
  assert float(aux) == 0.0  # OmniMoE has no auxiliary loss
  w_x = g_naive[0]["router_projection"]["w_x"]
  assert float(jnp.max(jnp.abs(w_x))) > 1e-3  # the router does get gradient
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), g_ec, g_naive)


def test_layer_trains_batch_norm_and_eval_uses_running_statistics():
  layer = MoELayer(8, omni_layer_cfg(), rngs=nnx.Rngs(0), dtype=jnp.float32)
  x = jax.random.normal(jax.random.key(1), (2, 5, 8))
  assert layer.router_kernel is None and set(layer.router_projection) == {"w_x", "w_y"}
  _, aux = layer(x, train=True)
  assert "max_over_mean_load" in aux["metrics"] and "load_balance" not in aux["metrics"]
  want = 0.1 * jnp.mean(x.reshape(10, 8) @ layer.router_projection["w_x"][...], 0)
  np.testing.assert_allclose(layer.router_state["mean_x"][...], want, rtol=1e-5, atol=1e-7)
  # eval: each token's output depends on that token alone (running statistics)
  full, _ = layer(x, train=False)
  alone, _ = layer(x[:1, :2], train=False)
  np.testing.assert_allclose(alone, full[:1, :2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
  "key,value,message",
  [
    (
      "model.moe.num_experts",
      1000,
      r"model\.moe\.num_experts=1000 must be a positive perfect square",
    ),
    ("model.moe.top_k", 4097, r"model\.moe\.top_k=4097"),
    (
      "model.moe.product_key.per_axis_k",
      65,
      r"model\.moe\.product_key\.per_axis_k=65 must be in \[0, n=64\]",
    ),
    (
      "model.moe.product_key.per_axis_k",
      4,
      r"model\.moe\.top_k=32 is larger than the per_axis_k\^2=16 candidate",
    ),
    (
      "model.moe.product_key.per_axis_k",
      8,
      r"model\.moe\.product_key\.per_axis_k=8 < min\(top_k=32, n=64\)",
    ),
    ("model.moe.shared.d_ff", 0, r"model\.moe\.shared\.d_ff=0 must be an int > 0"),
    ("model.moe.grouped_matmul", "gemm", r"model\.moe\.grouped_matmul='gemm' is not known"),
    (
      "model.moe.atomic.activation",
      "tanh",
      r"model\.moe\.atomic\.activation='tanh' is not known; valid: gelu, relu, silu",
    ),
    (
      "train.micro_batches",
      2,
      r"^train\.micro_batches=2 is not supported with model\.moe\.router='product_key': its "
      r"BatchNorm normalises by the tokens of each call",
    ),
    (
      "model.moe.loss_weights",
      {"load_balance": 0.01},
      r"model\.moe\.loss_weights=\{'load_balance': 0\.01\}: model\.moe\.router='product_key' "
      r"forms no probabilities",
    ),
  ],
)
def test_bad_omni_keys_are_rejected_before_compilation(
  data_dir, tmp_path, monkeypatch, key, value, message
):
  config = lm_shakespeare_omnimoe.get_config("size=small")
  set_key(config, key, value)
  with pytest.raises(ConfigError, match=message):
    validate_config(config)
  config.data.data_dir, config.train.progress_bar = data_dir, False
  compiled = []
  monkeypatch.setattr(step_lib, "make_train_step", lambda *a: compiled.append(a))
  with pytest.raises(ConfigError, match=message):
    train_and_evaluate(config, str(tmp_path), write_metrics=False)
  assert not compiled


def test_config_matches_the_default_moe_active_flops():
  for size in ("tiny", "small"):
    c = lm_shakespeare_omnimoe.get_config(f"size={size}")
    validate_config(c)
    m, e = c.model, c.model.moe
    n = math.isqrt(e.num_experts)
    omni = 3 * m.d_model * e.shared.d_ff + 2 * m.d_model * n + 2 * m.d_model * e.top_k
    default = base_config()
    apply_size(default, size)
    assert omni == 3 * m.d_model * default.model.moe.top_k * default.model.moe.expert_d_ff, size


def test_a_stored_omnimoe_config_becomes_the_moe_layer_it_computes():
  """Configs saved before the one MoE layer (ffn_type 'omnimoe', model.omni)
  load as router product_key + atomic experts + one shared expert."""
  saved = base_config().to_dict()
  saved["model"]["ffn_type"] = "omnimoe"
  saved["model"]["omni"] = dict(
    num_atomic_experts=64,
    top_k=4,
    per_axis_k=0,
    shared_d_ff=56,
    activation="gelu",
    schedule="expert_centric",
    grouped_matmul="loop",
    tile=4,
    block_rows=64,
  )
  c = ml_collections.ConfigDict(with_defaults(saved))
  validate_config(c)
  e = c.model.moe
  assert (c.model.ffn_type, e.router, e.experts, e.num_experts, e.top_k) == (
    "moe",
    "product_key",
    "atomic",
    64,
    4,
  )
  assert (e.shared.count, e.shared.d_ff, e.atomic.activation, dict(e.loss_weights)) == (
    1,
    56,
    "gelu",
    {},
  )
  assert (e.grouped_matmul, e.dropless.tile, e.dropless.block) == ("loop", 4, 64)
  assert "omni" not in c.model
  plain = ml_collections.ConfigDict(
    with_defaults(
      base_config().to_dict() | {"model": {**base_config().model.to_dict(), "omni": {"top_k": 32}}}
    )
  )
  assert "omni" not in plain.model and plain.model.moe.router == "topk"


@pytest.mark.integration
def test_tiny_omnimoe_lm_learns_in_thirty_steps(data_dir, tmp_path):
  c = lm_shakespeare_omnimoe.get_config("size=tiny")
  c.data.data_dir, c.train.progress_bar = data_dir, False
  run = train_and_evaluate(c, str(tmp_path))
  first, last = run.history[0]["ce_loss"], run.history[-1]["ce_loss"]
  assert first > last + 0.5, (first, last)
  assert run.eval["val_loss"] < math.log(256) - 0.5
  rec = run.history[-1]
  for key in (
    "moe/layer0/max_over_mean_load",
    "moe/layer1/routing_entropy",
    "moe/layer1/distinct_experts",
    "moe/layer0/padding_waste",
  ):
    assert key in rec, key
  assert 0 < rec["moe/layer0/routing_entropy"] <= math.log(64) + 1e-4
  assert "moe/layer0/load_balance" not in rec
  stats = run.state.rest["blocks"][0]["ffn"]["router_state"]
  assert float(np.abs(np.asarray(stats["mean_x"])).max()) > 0  # running statistics trained
