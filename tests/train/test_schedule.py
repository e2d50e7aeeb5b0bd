"""The optimizer that make_optimizer builds, read from outside: its learning-rate
schedule against the closed form (linear warmup from 0, cosine to
min_lr_ratio * lr at exactly train.steps), and whole AdamW trajectories
(global-norm clipping, weight decay on matrices only) against a numpy AdamW."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from moejax.config import base_config
from moejax.train import optimizer as optimizer_lib
from moejax.train import step as step_lib

PEAK, RATIO = 3e-3, 0.1


def train_cfg(**overrides):
  t = ml_collections.ConfigDict(base_config().train.to_dict())
  t.learning_rate, t.min_lr_ratio = PEAK, RATIO
  for key, value in overrides.items():
    t[key] = value
  return t


def closed_form_lr(s, steps, warmup, peak=PEAK, ratio=RATIO):
  end = peak * ratio
  if s < warmup:
    return peak * s / warmup
  decay = max(steps, warmup + 1) - warmup
  progress = min(s - warmup, decay) / decay
  return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * progress))


def learning_rates(t, num_updates):
  """lr used by update 0, 1, ...: with b1 = b2 = 0, no decay and a unit gradient on a
  vector, AdamW's step is exactly -lr(count) (eps 1e-8 vanishes next to 1 in float32)."""
  t = ml_collections.ConfigDict(t.to_dict())
  t.b1, t.b2, t.weight_decay, t.grad_clip = 0.0, 0.0, 0.0, 0.0
  opt = optimizer_lib.make_optimizer(t)
  params = {"scale": jnp.zeros((2,), jnp.float32)}
  grads = {"scale": jnp.ones((2,), jnp.float32)}

  def body(state, _):
    updates, state = opt.update(grads, state, params)
    return state, -updates["scale"]

  _, lrs = jax.lax.scan(body, opt.init(params), None, length=num_updates)
  lrs = np.asarray(lrs)
  np.testing.assert_array_equal(lrs[:, 0], lrs[:, 1])
  return lrs[:, 0]


@pytest.mark.parametrize("steps,warmup", [(20, 4), (13, 5), (10, 0)])
def test_learning_rate_schedule_closed_form(steps, warmup):
  lrs = learning_rates(train_cfg(steps=steps, warmup_steps=warmup), steps + 3)
  want = [closed_form_lr(s, steps, warmup) for s in range(steps + 3)]
  np.testing.assert_allclose(lrs, want, rtol=1e-5, atol=1e-9)
  # The anchors, written out: 0 at the start (unless there is no warmup), the peak at
  # the end of warmup, the floor at exactly `steps`, the mean halfway through the decay.
  np.testing.assert_allclose(lrs[0], 0.0 if warmup else PEAK, atol=1e-12)
  np.testing.assert_allclose(lrs[warmup], PEAK, rtol=1e-6)
  np.testing.assert_allclose(lrs[steps:], PEAK * RATIO, rtol=1e-5)
  assert lrs[steps - 1] > PEAK * RATIO * (1 + 1e-4)  # not at the floor one step early
  if (steps - warmup) % 2 == 0:
    np.testing.assert_allclose(
      lrs[warmup + (steps - warmup) // 2], PEAK * (1 + RATIO) / 2, rtol=1e-5
    )
  if warmup:
    np.testing.assert_allclose(lrs[warmup // 2], PEAK * (warmup // 2) / warmup, rtol=1e-5)


@pytest.mark.parametrize("steps", [3, 4])
def test_steps_not_past_warmup_reach_the_peak_then_the_floor(steps):
  # decay_steps = max(steps, warmup + 1): a one-step cosine after the warmup.
  lrs = learning_rates(train_cfg(steps=steps, warmup_steps=4), 7)
  np.testing.assert_allclose(
    lrs,
    [0, PEAK / 4, PEAK / 2, 3 * PEAK / 4, PEAK, PEAK * RATIO, PEAK * RATIO],
    rtol=1e-5,
    atol=1e-12,
  )


def numpy_adamw(t, params, grads_seq):
  """optax's clip_by_global_norm + adamw(schedule, mask = ndim >= 2), in float64."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  mu = {k: np.zeros_like(v) for k, v in p.items()}
  nu = {k: np.zeros_like(v) for k, v in p.items()}
  out = []
  for count, grads in enumerate(grads_seq, start=1):
    g = {k: np.asarray(v, np.float64) for k, v in grads.items()}
    norm = math.sqrt(sum(np.sum(v**2) for v in g.values()))
    if t.grad_clip > 0 and norm > t.grad_clip:
      g = {k: v * t.grad_clip / norm for k, v in g.items()}
    lr = closed_form_lr(count - 1, t.steps, t.warmup_steps, t.learning_rate, t.min_lr_ratio)
    for k in p:
      mu[k] = t.b1 * mu[k] + (1 - t.b1) * g[k]
      nu[k] = t.b2 * nu[k] + (1 - t.b2) * g[k] ** 2
      u = (mu[k] / (1 - t.b1**count)) / (np.sqrt(nu[k] / (1 - t.b2**count)) + 1e-8)
      if p[k].ndim >= 2:
        u = u + t.weight_decay * p[k]
      p[k] = p[k] - lr * u
    out.append({k: v.copy() for k, v in p.items()})
  return out


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_adamw_trajectory_equals_numpy(grad_clip):
  t = train_cfg(
    steps=8,
    warmup_steps=2,
    grad_clip=grad_clip,
    weight_decay=0.3,
    b1=0.8,
    b2=0.9,
    learning_rate=0.05,
  )
  rng = np.random.default_rng(0)
  params = {
    "kernel": rng.standard_normal((3, 2)),
    "embed": rng.standard_normal((2, 2, 2)),
    "scale": 1.0 + rng.standard_normal(4),
  }
  # gradient norms from 0.05 to 20: some clipped at 1.0, some not
  grads_seq = [
    {k: s * rng.standard_normal(v.shape) for k, v in params.items()}
    for s in (5.0, 0.02, 3.0, 0.1, 8.0, 0.05, 1.0, 0.3, 0.01)
  ]
  want = numpy_adamw(t, params, grads_seq)
  opt = optimizer_lib.make_optimizer(t)
  p = jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), params)
  state = opt.init(p)
  update = jax.jit(opt.update)
  for i, grads in enumerate(grads_seq):
    updates, state = update(jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), grads), state, p)
    p = optax.apply_updates(p, updates)
    for k in params:
      np.testing.assert_allclose(p[k], want[i][k], rtol=2e-5, atol=2e-6, err_msg=f"{i} {k}")


def test_weight_decay_skips_vectors():
  # A zero gradient leaves only the decay: matrices shrink by lr * wd, vectors stay.
  t = train_cfg(steps=10, warmup_steps=0, weight_decay=0.5, learning_rate=0.1)
  opt = optimizer_lib.make_optimizer(t)
  params = {"w": jnp.ones((2, 3)), "b": jnp.ones((3,)), "e": jnp.ones((2, 1, 2))}
  updates, _ = jax.jit(opt.update)(jax.tree.map(jnp.zeros_like, params), opt.init(params), params)
  np.testing.assert_allclose(updates["w"], -0.1 * 0.5 * np.ones((2, 3)), rtol=1e-6)
  np.testing.assert_allclose(updates["e"], -0.1 * 0.5 * np.ones((2, 1, 2)), rtol=1e-6)
  np.testing.assert_array_equal(updates["b"], np.zeros(3))


def test_cross_entropy_closed_form():
  logits = jnp.array(
    [[[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, -1.0, 1.0]], [[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, -3.0, 0.0]]],
    jnp.bfloat16,
  )
  targets = jnp.array([[1, 0], [3, 2]])
  x = np.asarray(logits, np.float64)
  lse = np.log(np.exp(x).sum(-1))
  picked = np.take_along_axis(x, np.asarray(targets)[..., None], -1)[..., 0]
  ce = step_lib.cross_entropy(logits, targets)
  assert ce.dtype == jnp.float32
  np.testing.assert_allclose(ce, np.mean(lse - picked), rtol=1e-6)


def test_train_and_eval_steps():
  """Two jitted train steps of a one-layer LM with the aux-loss-free router and router
  jitter: the reported loss is CE + aux loss, the step counts up, the router bias
  moves, train mode (jitter) differs from eval mode, and eval is plain CE."""
  from moejax.configs import lm_shakespeare_moe
  from moejax.train.loop import init_state

  config = lm_shakespeare_moe.get_config("size=tiny,router=sigmoid_bias")
  config.model.num_layers, config.model.moe.num_experts, config.model.moe.top_k = 1, 4, 2
  config.model.moe.routing.jitter = 0.2
  config.model.moe.grouped_matmul = "tiled"  # the quickest to compile
  config.model.moe.loss_weights = {"load_balance": 0.5, "z_loss": 0.1}
  graphdef, state, opt = init_state(config)
  tokens = np.random.default_rng(0).integers(0, 256, (2, 9))
  batch = {
    "inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
    "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
  }
  train_step = step_lib.make_train_step(graphdef, opt, seed=7)
  eval_step = step_lib.make_eval_step(graphdef)
  eval_ce0, _ = eval_step(state.params, state.rest, batch)
  params0 = jax.tree.map(np.asarray, state.params)  # (the step donates its input state)
  bias0 = np.asarray(jax.tree.leaves(state.rest)[0])
  assert 4.0 < float(eval_ce0) < 7.0  # about log(256) = 5.5 at initialisation
  for step in range(2):
    state, metrics = train_step(state, batch)
    assert int(state.step) == step + 1
    assert float(metrics["aux_loss"]) > 0.01 and float(metrics["grad_norm"]) > 0
    np.testing.assert_allclose(metrics["loss"], metrics["ce_loss"] + metrics["aux_loss"], rtol=1e-6)
    if step == 0:  # same parameters as eval_ce0: only the jitter of train mode differs
      assert abs(float(metrics["ce_loss"]) - float(eval_ce0)) > 1e-4
  assert not np.allclose(jax.tree.leaves(state.rest)[0], bias0)  # router state carried
  assert all(
    not np.allclose(a, b) for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params0))
  )
