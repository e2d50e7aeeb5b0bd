"""SmoothSMoE (router 'smooth_topk', loss 'smooth_boundary'): continuity across a
top-k switch where hard top-k jumps, the eta -> 0 limit, the active-expert count,
and the boundary loss against numpy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from moejax.losses import get_loss, loss_config
from moejax.routing import call_router
from tests.helpers import moe_cfg, random_logits

shapes = st.tuples(st.sampled_from([(6, 5, 2), (16, 8, 3)]), st.integers(0, 2**16))


def eta_param(eta):
  """eta_p with softplus(eta_p) = eta."""
  return math.log(math.expm1(eta))


def route(name, logits, **cfg):
  cfg = moe_cfg(router=name, num_experts=logits.shape[1], **cfg)
  return call_router(name, jnp.asarray(logits), cfg, train=True)


def dense_weights(routing, num_experts):
  idx, w = np.asarray(routing.expert_index), np.asarray(routing.masked_weight())
  out = np.zeros((idx.shape[0], num_experts))
  for s in range(idx.shape[1]):
    np.add.at(out, (np.arange(idx.shape[0]), idx[:, s]), w[:, s])
  return out


def path_jumps(name, step, **cfg):
  """Largest change of the dense weights between neighbours on a path where
  expert 2's logit crosses expert 1's (the top-2 set switches at s = 1.0)."""
  s = np.arange(0.5, 1.5 + step / 2, step, dtype=np.float64)
  logits = np.tile(np.array([2.0, 1.0, 0.0, -1.0, -2.0]), (s.size, 1))
  logits[:, 2] = s
  w = dense_weights(route(name, logits.astype(np.float32), top_k=2, **cfg).routing, 5)
  return np.abs(np.diff(w, axis=0)).max()


def test_weights_are_continuous_across_a_top_k_switch():
  cfg = dict(smooth_topk=dict(eta_init=eta_param(0.5)))
  coarse, fine = path_jumps("smooth_topk", 1e-2, **cfg), path_jumps("smooth_topk", 1e-3, **cfg)
  assert fine < 0.2 * coarse and fine < 0.01, (coarse, fine)
  hard_coarse = path_jumps("topk", 1e-2, routing={"renormalize": True})
  hard_fine = path_jumps("topk", 1e-3, routing={"renormalize": True})
  assert hard_fine > 0.1 and hard_fine > 0.5 * hard_coarse  # the jump does not shrink


@settings(max_examples=40)
@given(shapes)
def test_eta_to_zero_is_hard_top_k(shape):
  (t, e, k), seed = shape
  logits = random_logits(seed, t, e)
  smooth = route("smooth_topk", logits, top_k=k, smooth_topk=dict(eta_init=-40.0)).routing
  hard = route("topk", logits, top_k=k, routing={"renormalize": True}).routing
  assert np.asarray(smooth.valid).sum(1).tolist() == [k] * t
  np.testing.assert_allclose(dense_weights(smooth, e), dense_weights(hard, e), atol=1e-6)


@settings(max_examples=40)
@given(shapes, st.sampled_from([0.05, 0.3, 1.0, 3.0]))
def test_active_count_is_the_band(shape, eta):
  (t, e, k), seed = shape
  logits = random_logits(seed, t, e)
  out = route("smooth_topk", logits, top_k=k, smooth_topk=dict(eta_init=eta_param(eta)))
  r = out.routing
  active = np.asarray(r.valid).sum(1)
  g_k = np.sort(logits, 1)[:, -k][:, None]
  band = (logits > g_k - eta).sum(1)
  np.testing.assert_array_equal(active, band)
  assert (active >= k).all() and (active <= k + band).all()
  w = np.asarray(r.combine_weight)
  assert w.dtype == np.float32 and (w >= 0).all()
  np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-5)
  idx = np.asarray(r.expert_index)
  for row in range(t):  # valid slots name the band's experts, once each
    expected = set(np.flatnonzero(logits[row] > g_k[row] - eta).tolist())
    assert set(idx[row][np.asarray(r.valid[row])].tolist()) == expected


def test_boundary_loss_value_and_gradient():
  logits = random_logits(4, 32, 8)
  eta, k, alpha, h = 0.4, 2, 0.7, 0.5
  cfg = moe_cfg(
    router="smooth_topk",
    top_k=k,
    smooth_topk=dict(eta_init=eta_param(eta), h_offset=h),
    losses=dict(smooth_boundary=dict(alpha=alpha)),
  )
  loss_cfg = loss_config("smooth_boundary", cfg)

  def loss(offset):
    out = call_router(
      "smooth_topk", jnp.asarray(logits), cfg, state={"eta_offset": offset}, train=True
    )
    return get_loss("smooth_boundary")(out, loss_cfg)

  g_k = np.sort(logits, 1)[:, -k][:, None]
  x = (logits > g_k - eta).sum(1).mean()
  np.testing.assert_allclose(float(loss(0.0)), alpha * eta * (x - k - h) * 32, rtol=1e-5)
  # d/d offset = alpha * T * (X - k - h) * sigmoid(eta_p): widens the band iff X < k + h
  sig = 1 / (1 + math.exp(-eta_param(eta)))
  np.testing.assert_allclose(float(jax.grad(loss)(0.0)), alpha * 32 * (x - k - h) * sig, rtol=1e-4)


def test_router_sweep_uses_the_official_loss_scale():
  """The official code adds L_b to the balance loss and scales that auxiliary loss by
  0.01 (GMoE aux_loss_weights, Language-Glue --aux_loss_weight); its gate defaults are
  alpha 1, h 0.5, eta_init -9, a 1, b 50. The sweep once weighted L_b at 1.0 (100x)."""
  from moejax.studies import runner
  from moejax.train.sweep import load_config_file

  _, scorer = runner.prepare(load_config_file("configs/studies/routers.py"))
  moe = scorer.config("smooth_topk", {}, 0).model.moe
  assert moe.router == "smooth_topk"
  assert moe.loss_weights.smooth_boundary == 1e-2 == moe.loss_weights.load_balance
  assert moe.losses.smooth_boundary.alpha == 1.0
  assert moe.smooth_topk.to_dict() == dict(eta_init=-9.0, a=1.0, b=50.0, h_offset=0.5)
