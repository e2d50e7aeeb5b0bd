"""OmniMoE (arXiv 2602.05711): product-key search == brute force, expert-centric
== naive gather == a float64 per-token loop, bad config keys, and a tiny LM that learns."""
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings, strategies as st

from configs import lm_shakespeare_omnimoe
from moejax.config import base_config, validate_config
from moejax.errors import ConfigError
from moejax.experts.atomic import atomic_expert_centric, atomic_naive
from moejax.layers.omnimoe import OmniMoELayer
from moejax.routing.base import Routing
from moejax.routing.product_key import product_key_top_k, route_product_key
from moejax.train import step as step_lib
from moejax.train.loop import train_and_evaluate
from tests.train.test_training import data_dir  # noqa: F401  (session fixture)

# (n, per-axis k >= min(top_k, n), top_k <= n^2, tokens, seed); few shapes, many contents.
grids = st.sampled_from([1, 2, 3, 5, 8]).flatmap(lambda n: st.integers(1, n * n).flatmap(
    lambda k: st.tuples(st.just(n), st.integers(min(k, n), n), st.just(k),
                        st.sampled_from([1, 7]), st.integers(0, 2**16))))


def brute_force(lp_x, lp_y, k):
  """Top-k of all N = n^2 sums (float32, as the router adds), flat index i * n + j."""
  scores = (lp_x[:, :, None] + lp_y[:, None, :]).reshape(len(lp_x), -1)
  index = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, index, 1), index


@settings(max_examples=30)  # each new shape compiles (suite budget)
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


@settings(max_examples=25)  # each new shape compiles (suite budget)
@given(grids, st.booleans())
def test_router_weights_are_product_probabilities(grid, train):
  n, a, k, t, seed = grid
  rng = np.random.default_rng(seed)
  z_x, z_y = rng.standard_normal((2, t, n)).astype(np.float32)
  stats = {"mean_x": rng.standard_normal(n).astype(np.float32), "var_x": np.full(n, 2.0, np.float32),
           "mean_y": np.zeros(n, np.float32), "var_y": np.ones(n, np.float32)}
  routing, _, new = route_product_key(jnp.asarray(z_x), jnp.asarray(z_y), stats, top_k=k,
                                      per_axis_k=a, train=train)

  def log_probs(z, mean, var):
    if train:  # batch statistics (biased variance)
      mean, var = z.mean(0), z.var(0)
    zn = (z.astype(np.float64) - mean) / np.sqrt(var + 1e-5)
    return zn - np.log(np.exp(zn).sum(-1, keepdims=True))

  lp_x, lp_y = log_probs(z_x, stats["mean_x"], stats["var_x"]), log_probs(z_y, stats["mean_y"], stats["var_y"])
  want_score, want_index = brute_force(lp_x, lp_y, k)
  np.testing.assert_array_equal(np.sort(routing.expert_index, 1), np.sort(want_index, 1))
  np.testing.assert_allclose(routing.combine_weight, np.exp(want_score), rtol=1e-5, atol=1e-7)
  if train and t > 1:
    np.testing.assert_allclose(new["mean_x"], 0.9 * stats["mean_x"] + 0.1 * z_x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new["var_y"], 0.9 + 0.1 * z_y.var(0, ddof=1), rtol=1e-5)
  elif not train:
    assert all(new[key] is stats[key] for key in stats)


def random_routing(seed, t, num_experts, k):
  rng = np.random.default_rng(seed)
  index = np.stack([rng.choice(num_experts, k, replace=False) for _ in range(t)])
  return Routing(jnp.asarray(index, jnp.int32), jnp.asarray(rng.uniform(0.05, 1, (t, k)), jnp.float32),
                 jnp.ones((t, k), bool))


@pytest.mark.parametrize("activation", ["silu", "relu"])
def test_naive_gather_equals_a_float64_per_token_loop(activation):
  t, d, num_experts, k = 9, 6, 16, 4
  rng = np.random.default_rng(0)
  x, u, dn = (rng.standard_normal(s).astype(np.float32) for s in ((t, d), (num_experts, d), (num_experts, d)))
  routing = random_routing(1, t, num_experts, k)
  y = atomic_naive(jnp.asarray(x), jnp.asarray(u), jnp.asarray(dn), routing, activation)
  act = {"silu": lambda v: v / (1 + math.exp(-v)), "relu": lambda v: max(v, 0.0)}[activation]
  want = np.zeros((t, d))
  for i in range(t):
    for e, w in zip(np.asarray(routing.expert_index[i]), np.asarray(routing.combine_weight[i], np.float64)):
      want[i] += w * act(float(u[e].astype(np.float64) @ x[i].astype(np.float64))) * dn[e].astype(np.float64)
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("matmul,tile,act", [("tiled", 8, "silu"), ("tiled", 1, "gelu"),
                                             ("loop", 4, "relu")])
def test_expert_centric_equals_naive_forward_and_gradients(matmul, tile, act):
  t, d, n, k = 40, 16, 6, 5
  rng = np.random.default_rng(2)
  f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  params = {"rx": f32(d, n), "ry": f32(d, n), "u": f32(n * n, d) / 4, "d": f32(n * n, d) / 4}
  x, cotangent = f32(t, d), f32(t, d)
  stats = {"mean_x": jnp.zeros(n), "var_x": jnp.ones(n), "mean_y": jnp.zeros(n), "var_y": jnp.ones(n)}

  def loss(params, x, schedule):
    routing, _, _ = route_product_key(x @ params["rx"], x @ params["ry"], stats, top_k=k,
                                      per_axis_k=k, train=True)
    if schedule == "naive":
      y = atomic_naive(x, params["u"], params["d"], routing, act)
    else:
      y, _ = atomic_expert_centric(x, params["u"], params["d"], routing, act,
                                   grouped_matmul=matmul, tile=tile, block_rows=8)
    return jnp.sum(y * cotangent), y

  grad = jax.grad(loss, argnums=(0, 1), has_aux=True)
  (g_naive, y_naive), (g_ec, y_ec) = grad(params, x, "naive"), grad(params, x, "expert_centric")
  np.testing.assert_allclose(y_ec, y_naive, rtol=1e-5, atol=1e-5)
  assert float(jnp.max(jnp.abs(g_naive[0]["rx"]))) > 1e-3  # the router does get gradient
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), g_ec, g_naive)


def test_layer_schedules_agree_and_eval_uses_running_statistics():
  cfg = base_config().model.omni
  cfg.update(num_atomic_experts=16, top_k=3, shared_d_ff=8)
  layers = {s: OmniMoELayer(8, ml_collections.FrozenConfigDict({**cfg.to_dict(), "schedule": s}),
                            rngs=nnx.Rngs(0), dtype=jnp.float32) for s in ("naive", "expert_centric")}
  x = jax.random.normal(jax.random.key(1), (2, 5, 8))
  (y_n, aux_n), (y_e, aux_e) = (layers[s](x, train=True) for s in ("naive", "expert_centric"))
  np.testing.assert_allclose(y_e, y_n, rtol=1e-5, atol=1e-6)
  assert float(aux_n["aux_loss"]) == 0.0 and "max_over_mean_load" in aux_n["metrics"]
  layer = layers["naive"]
  np.testing.assert_allclose(layer.bn_stats["mean_x"][...],
                             0.1 * jnp.mean(x.reshape(10, 8) @ layer.router_x[...], 0), rtol=1e-5)
  # eval: each token's output depends on that token alone (running statistics)
  full, _ = layer(x, train=False)
  alone, _ = layer(x[:1, :2], train=False)
  np.testing.assert_allclose(alone, full[:1, :2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("key,value,message", [
    ("num_atomic_experts", 1000, r"model\.omni\.num_atomic_experts=1000 must be a positive perfect square"),
    ("num_atomic_experts", 0, r"model\.omni\.num_atomic_experts=0 must be"),
    ("top_k", 4097, r"model\.omni\.top_k=4097 must be in \[1, model\.omni\.num_atomic_experts=4096\]"),
    ("top_k", 0, r"model\.omni\.top_k=0 must be in"),
    ("per_axis_k", 65, r"model\.omni\.per_axis_k=65 must be in \[0, n=64\]"),
    ("per_axis_k", 4, r"model\.omni\.top_k=32 is larger than the per_axis_k\^2=16 candidate"),
    ("per_axis_k", 8, r"model\.omni\.per_axis_k=8 < min\(top_k=32, n=64\)"),
    ("shared_d_ff", 0, r"model\.omni\.shared_d_ff=0 must be > 0"),
    ("schedule", "nope", r"model\.omni\.schedule='nope' is not known; valid: expert_centric, naive"),
    ("grouped_matmul", "gemm", r"model\.omni\.grouped_matmul='gemm' is not known; valid: auto, "),
    ("activation", "tanh", r"model\.omni\.activation='tanh' is not known; valid: gelu, relu, silu"),
])
def test_bad_omni_keys_are_rejected_before_compilation(data_dir, tmp_path, monkeypatch,  # noqa: F811
                                                       key, value, message):
  config = lm_shakespeare_omnimoe.get_config("size=small")
  config.model.omni[key] = value
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
    m, o = c.model, c.model.omni
    n = math.isqrt(o.num_atomic_experts)
    omni = 3 * m.d_model * o.shared_d_ff + 2 * m.d_model * n + 2 * m.d_model * o.top_k
    assert omni == 3 * m.d_model * m.moe.top_k * m.moe.expert_d_ff, size


def test_tiny_omnimoe_lm_learns_in_thirty_steps(data_dir, tmp_path):  # noqa: F811
  c = lm_shakespeare_omnimoe.get_config("size=tiny")
  c.data.data_dir, c.train.progress_bar = data_dir, False
  run = train_and_evaluate(c, str(tmp_path))
  first, last = run.history[0]["ce_loss"], run.history[-1]["ce_loss"]
  assert first > last + 0.5, (first, last)
  assert run.eval["val_loss"] < math.log(256) - 0.5
  rec = run.history[-1]
  for key in ("moe/layer0/max_over_mean_load", "moe/layer1/routing_entropy",
              "moe/layer1/dead_fraction", "moe/layer0/padding_waste"):
    assert key in rec, key
  assert 0 < rec["moe/layer0/routing_entropy"] <= math.log(64) + 1e-4
  stats = run.state.rest["blocks"][0]["ffn"]["bn_stats"]
  assert float(np.abs(np.asarray(stats["mean_x"])).max()) > 0  # running statistics trained
