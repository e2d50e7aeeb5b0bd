"""Gradient accumulation (train.micro_batches), the router state-update protocol
and the dtype policy (moejax/train/step.py, moejax/routing/base.py).

4 micro-batches of 8 rows must give the step of one batch of 32 with the
default loss weights (load_balance 1e-2, z_loss 1e-3): gradients within 1e-5,
params after one optimizer step within 1e-5, and the aux-loss-free bias within
1e-6 (it moves once, from the load of all 32 rows). The load-balance loss
E * sum_e f_e P_e is a product of two batch means; with
train.balance_statistics='step' every micro-batch uses the step's f (one
forward-only pass first), so it is exact (measured: grads 7.5e-9); with
'micro_batch' each uses its own f, a different loss (grads differ by 5.7e-5
on topk, 2.6e-5 on sigmoid_bias).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.config import apply_size, base_config
from moejax.validation import validate_config, validate_micro_batches
from moejax.errors import ConfigError
from moejax.models.decoder import stack_layers, unstack_layers
from moejax.routing import get_router, router_config
from moejax.routing.base import RouterSpec, check_micro_batches
from moejax.train import step as step_lib
from moejax.train.loop import init_state, train_and_evaluate
from tests.helpers import moe_cfg, random_logits, set_key

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

MICRO, ROWS = 4, 32


def accumulation_config(router="topk", model=(), **train):
  """Default loss weights; `model`: (key, value) pairs of the model section."""
  c = base_config()
  apply_size(c, "tiny")
  c.data.batch_size = ROWS
  c.model.moe.router = router
  c.train.warmup_steps = 0  # the first step already moves the params
  for key, value in model:
    c.model[key] = value
  for key, value in train.items():
    c.train[key] = value
  validate_config(c)
  return c


def random_batch(config, rows=ROWS, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, config.model.vocab_size, (rows, config.data.seq_len + 1))
  tokens = jnp.asarray(tokens, jnp.int32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}


def host(tree):
  return jax.tree.map(np.asarray, tree)


def max_diff(a, b) -> float:
  diffs = jax.tree.leaves(
    jax.tree.map(
      lambda x, y: np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))), a, b
    )
  )
  return float(max(diffs, default=0.0))


@functools.lru_cache(maxsize=None)
def setup(router, model=()):
  """A scanned model holds the loop model's variables, stacked (from a seed it draws its own)."""
  config = accumulation_config(router, model)
  graphdef, state, optimizer = init_state(config)
  if config.model.scan_layers:
    loop, _, loop_state, _ = setup(router, tuple(kv for kv in model if kv[0] != "scan_layers"))
    _, params, rest = stack_layers(loop.model, loop_state.params, loop_state.rest)
    state = state.replace(params=params, rest=rest, opt_state=optimizer.init(params))
  return config, graphdef, host(state), optimizer


@functools.lru_cache(maxsize=None)
def grads_of(router, micro_batches, balance_statistics="step", model=()):
  """(grads, metrics, new_rest) of the step's batch of 32, float32 on the host,
  in the loop layout (a scanned model's layers unstacked)."""
  config, graphdef, state, _ = setup(router, model)
  grad_fn = jax.jit(step_lib.make_grad_fn(graphdef, micro_batches, balance_statistics))
  grads, metrics, rest = host(
    grad_fn(state.params, state.rest, random_batch(config), jax.random.key(0))
  )
  _, grads, rest = unstack_layers(config.model, grads, rest)
  return grads, metrics, rest


@pytest.mark.integration
@pytest.mark.parametrize("router", ["topk", "sigmoid_bias"])
def test_grads_of_4x8_equal_one_batch_of_32(router):
  one, micro = grads_of(router, 1), grads_of(router, MICRO)
  assert all(g.dtype == np.float32 for g in jax.tree.leaves(micro[0]))
  grad_diff = max_diff(one[0], micro[0])
  print(f"{router}: max |grad 1x32 - grad 4x8| = {grad_diff:.3g}")
  assert grad_diff <= 1e-5
  assert max(np.max(np.abs(g)) for g in jax.tree.leaves(one[0])) > 1e-3  # not vacuous
  for key in ("loss", "ce_loss", "aux_loss", "grad_norm"):
    np.testing.assert_allclose(micro[1][key], one[1][key], rtol=1e-6, err_msg=key)
  # load fractions are token means: averaged over micro-batches they are the batch's;
  # the logged load-balance loss uses the step's f: the one-batch value too
  for key in ("load_fraction", "load_balance"):
    np.testing.assert_allclose(
      micro[1]["moe"][0][key], one[1]["moe"][0][key], atol=1e-6, err_msg=key
    )
  assert max_diff(one[2], micro[2]) <= 1e-6  # router state (sigmoid_bias: the bias)


def test_micro_batch_statistics_give_a_different_load_balance_loss():
  """balance_statistics='micro_batch': each micro-batch its own f (no extra forward),
  so the gradient is not the one-batch gradient (the check above would catch it)."""
  one, micro = grads_of("topk", 1), grads_of("topk", MICRO, "micro_batch")
  grad_diff = max_diff(one[0], micro[0])
  print(f"micro_batch statistics: max |grad 1x32 - grad 4x8| = {grad_diff:.3g}")
  assert grad_diff > 1e-5
  assert abs(float(micro[1]["moe"][0]["load_balance"] - one[1]["moe"][0]["load_balance"])) > 1e-4


@pytest.mark.integration
def test_scanned_rematerialised_blocks_get_the_step_statistics():
  """model.scan_layers with remat: the step's counts reach every scanned layer
  (stacked [L, ...]), the scanned model holding the loop model's parameters."""
  model = (("scan_layers", True), ("remat", "full"))
  one, micro = grads_of("topk", 1), grads_of("topk", MICRO, model=model)
  grad_diff = max_diff(one[0], micro[0])
  print(f"scanned, remat: max |grad 1x32 (loop) - grad 4x8| = {grad_diff:.3g}")
  assert grad_diff <= 1e-5


@pytest.mark.integration
def test_train_step_4x8_equals_one_batch_and_the_bias_moves_once():
  config, graphdef, state, optimizer = setup("sigmoid_bias")
  batch = random_batch(config)
  after = {}
  for m in (1, MICRO):
    train_step = step_lib.make_train_step(graphdef, optimizer, config.seed, None, m)
    new_state, metrics = train_step(jax.tree.map(jnp.asarray, state), batch)
    after[m] = host(new_state)
    assert np.isfinite(metrics["loss"])
  param_diff = max_diff(after[1].params, after[MICRO].params)
  bias_diff = max_diff(after[1].rest, after[MICRO].rest)
  print(f"params after one step: max diff {param_diff:.3g}; bias: max diff {bias_diff:.3g}")
  assert param_diff <= 1e-5
  assert max_diff(after[1].params, state.params) > 1e-3  # the step did move them
  assert bias_diff <= 1e-6
  assert int(after[MICRO].step) == 1

  # What the protocol prevents: the bias updated once per micro-batch (each
  # micro-batch routed with the bias its predecessor left) ends elsewhere.
  rows = step_lib.split_micro_batches(batch, MICRO)
  grad_fn = jax.jit(step_lib.make_grad_fn(graphdef, 1))
  rest = state.rest
  for m in range(MICRO):
    rest = grad_fn(state.params, rest, jax.tree.map(lambda x: x[m], rows), jax.random.key(0))[2]
  per_micro_batch = max_diff(host(rest), after[1].rest)
  print(f"bias updated per micro-batch: max diff {per_micro_batch:.3g}")
  assert per_micro_batch > 1e-4 > 1e-6  # the 1e-6 check above would catch it


def test_micro_batches_are_strided_so_each_keeps_rows_on_every_shard():
  batch = {"inputs": jnp.arange(16).reshape(8, 2)}
  micro = step_lib.split_micro_batches(batch, 4)["inputs"]
  assert micro.shape == (4, 2, 2)
  # micro-batch m = rows m, m + 4: one in each half (a data axis of 2 keeps both shards busy)
  np.testing.assert_array_equal(micro[:, :, 0] // 2, [[0, 4], [1, 5], [2, 6], [3, 7]])


@pytest.mark.parametrize(
  "router,extra",
  [
    ("sigmoid_bias", {}),
    ("group_limited", {"routing": {"num_groups": 4, "topk_groups": 2}}),
    ("mahalanobis", {"mahalanobis": {"ema_decay": 0.9}}),
    ("sere", {}),
  ],
)
def test_router_state_from_summed_stats_equals_one_call(router, extra):
  """Router level: route 4 strided groups of tokens from the same state, sum their
  stats, update once == one call on all the tokens."""
  spec = get_router(router)
  routing = {"bias_update_rate": 1e-2, **extra.pop("routing", {})}
  cfg = moe_cfg(router=router, num_experts=8, top_k=2, routing=routing, **extra)
  logits = jnp.asarray(random_logits(5, 64, 8))
  state = spec.initial_state(8)
  if router == "mahalanobis":  # a non-trivial covariance to start from
    a = np.random.default_rng(2).random((8, 8)).astype(np.float32)
    state = {"cooc_cov": jnp.asarray(a @ a.T / 8)}
  cfg = router_config(spec, cfg)
  route = jax.jit(functools.partial(spec.route, cfg=cfg, rng=None, train=True))
  whole = route(logits, state=state)
  parts = [route(logits[m::MICRO], state=state) for m in range(MICRO)]
  summed = jax.tree.map(lambda *xs: sum(xs), *[p.stats for p in parts])
  once = spec.update_state(state, summed, cfg)
  for name in whole.state:
    np.testing.assert_allclose(once[name], whole.state[name], rtol=0, atol=1e-6, err_msg=name)
  if router in ("sigmoid_bias", "group_limited"):
    # once per micro-batch instead: a different bias (the failure the protocol avoids)
    stepped = state
    for p in parts:
      stepped = spec.update_state(stepped, p.stats, cfg)
    assert np.max(np.abs(np.asarray(stepped["bias"] - whole.state["bias"]))) > 1e-3


@pytest.mark.integration
def test_bfloat16_params_and_optimizer_state_are_used():
  config = accumulation_config(
    "sigmoid_bias", param_dtype="bfloat16", opt_state_dtype="bfloat16", micro_batches=2
  )
  graphdef, state, optimizer = init_state(config)

  def dtypes(tree):
    return {
      jax.tree_util.keystr(k): v.dtype
      for k, v in jax.tree_util.tree_leaves_with_path(tree)
      if hasattr(v, "dtype")
    }

  def check(state):
    params = dtypes(state.params)
    assert params["['embed']"] == jnp.bfloat16
    assert params["['blocks'][0]['ffn']['experts']['w_up']"] == jnp.bfloat16
    assert params["['blocks'][0]['ffn']['router_kernel']"] == jnp.float32  # router: float32
    moments = [d for k, d in dtypes(state.opt_state).items() if d != jnp.int32]
    assert moments and all(d == jnp.bfloat16 for d in moments), moments
    assert all(d == jnp.float32 for d in dtypes(state.rest).values())  # router state

  check(state)
  train_step = step_lib.make_train_step(
    graphdef, optimizer, config.seed, None, config.train.micro_batches
  )
  new_state, metrics = train_step(state, random_batch(config))
  check(new_state)
  assert np.isfinite(float(metrics["loss"]))
  assert int(new_state.step) == 1


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("train.micro_batches", 0, r"^train\.micro_batches=0 must be an int >= 1$"),
    ("train.micro_batches", -2, r"^train\.micro_batches=-2 must be an int >= 1$"),
    ("train.micro_batches", 3, r"^train\.micro_batches=3 must divide data\.batch_size=32$"),
    (
      "mesh.data",
      4,
      r"^train\.micro_batches=16 must divide the 8 rows of each of the 4 "
      r"batch shards \(data\.batch_size=32\)",
    ),
    (
      "train.param_dtype",
      "float16",
      r"^train\.param_dtype='float16' is not known; valid: bfloat16, float32$",
    ),
    (
      "train.opt_state_dtype",
      "fp8",
      r"^train\.opt_state_dtype='fp8' is not known; valid: bfloat16, float32$",
    ),
    (
      "train.balance_statistics",
      "exact",
      r"^train\.balance_statistics='exact' is not known; valid: micro_batch, step$",
    ),
    (
      "model.moe.loss_weights.dpsl",
      1e-2,
      r"^train\.micro_batches=16 with train\.balance_statistics='step' is not supported "
      r"with model\.moe\.loss_weights\.dpsl=0\.01: ",
    ),
    (
      "model.moe.router",
      "smooth_topk",
      r"^train\.micro_batches=16 is not supported with model\.moe\.router='smooth_topk'",
    ),
  ],
)
def test_bad_accumulation_config_is_rejected_before_compilation(
  tmp_path, monkeypatch, key, value, message
):
  config = base_config()
  config.data.batch_size = ROWS
  config.train.micro_batches = 16
  config.model.moe.loss_weights = {"smooth_boundary": 1e-2}
  set_key(config, key, value)
  compiled = []
  monkeypatch.setattr(step_lib, "make_train_step", lambda *a: compiled.append(a))
  with pytest.raises(ConfigError, match=message) as error:
    train_and_evaluate(config, str(tmp_path / "run"), write_metrics=False)
  assert "\n" not in str(error.value)
  assert not compiled and not (tmp_path / "run").exists()


def test_stateful_router_without_the_protocol_refuses_micro_batches():
  spec = RouterSpec("needs_protocol", fn=None, init_state=lambda e: {"ema": jnp.zeros(e)})
  check_micro_batches(spec, router_config(spec, moe_cfg()), 1)  # one batch: its own update
  with pytest.raises(
    ConfigError,
    match=r"^train\.micro_batches=2 is not supported with "
    r"model\.moe\.router='needs_protocol': ",
  ):
    check_micro_batches(spec, router_config(spec, moe_cfg()), 2)
  # every registered router with state implements the protocol
  for name in ("sigmoid_bias", "group_limited", "mahalanobis", "sere"):
    assert get_router(name).update_state is not None, name


def test_batch_shards_known_only_from_the_devices():
  config = base_config()
  config.data.batch_size, config.train.micro_batches = ROWS, 8
  validate_config(config)  # mesh.data=-1: checked again once the devices are known
  validate_micro_batches(config, 4)  # 8 rows per shard
  with pytest.raises(ConfigError, match=r"^train\.micro_batches=8 must divide the 4 rows"):
    validate_micro_batches(config, 8)
