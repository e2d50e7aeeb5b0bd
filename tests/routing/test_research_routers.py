"""The batch-1 research routers against the generic Routing contract, both dispatch
backends against a numpy per-token loop, the MoE layer end to end (state
updates), and ConfigErrors that name the bad key and value."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.config import base_config
from moejax.validation import validate_config
from moejax.dispatch import get_dispatcher
from moejax.errors import ConfigError
from moejax.experts import swiglu_experts
from moejax.layers.moe import MoELayer
from moejax.routing import Routing, get_router, router_config
from tests.helpers import moe_cfg, random_logits, set_key

ROUTERS = {  # name: extra config
  "probmoe": {},
  "probmoe_dynamic": dict(probmoe=dict(k_min=1, k_max=3)),
  "smooth_topk": dict(smooth_topk=dict(eta_init=0.0)),
  "mahalanobis": {},
  "as_coot": {},
  "capacity_aware": dict(capacity_aware=dict(gamma=0.75, expand_r=2.0)),
  "sere": dict(sere=dict(rho=0.2)),
}
D, F = 8, 12


def setup(label, e, k, train, seed=0, t=24):
  name = label.removesuffix("_dynamic")
  cfg = moe_cfg(router=name, num_experts=e, top_k=k, **ROUTERS[label])
  spec = get_router(name)
  state = spec.initial_state(e)
  if name == "mahalanobis":  # a non-trivial co-occurrence covariance
    a = np.random.default_rng(seed).random((e, e)).astype(np.float32)
    state = {"cooc_cov": jnp.asarray(a @ a.T / e)}
  if name == "sere":
    s = np.random.default_rng(seed).random((e, e)).astype(np.float32)
    state = {"expert_similarity": jnp.asarray((s + s.T) / 2)}
  route = functools.partial(spec.route, cfg=router_config(spec, cfg), state=state, train=train)
  out = jax.jit(route)(jnp.asarray(random_logits(seed, t, e)), rng=jax.random.key(seed))
  return out, cfg


def padded(routing, num_slots):
  """The same routing with invalid slots appended up to `num_slots` (one shape for all)."""
  pad = num_slots - routing.num_slots
  return Routing(
    jnp.pad(routing.expert_index, ((0, 0), (0, pad))),
    jnp.pad(routing.combine_weight, ((0, 0), (0, pad))),
    jnp.pad(routing.valid, ((0, 0), (0, pad))),
  )


def numpy_reference(x, routing, weights):
  """y[t] = sum over valid slots of weight * expert(x[t]), one token at a time (float64)."""
  x = np.asarray(x, np.float64)
  idx, w, valid = (
    np.asarray(a) for a in (routing.expert_index, routing.combine_weight, routing.valid)
  )
  y = np.zeros_like(x)
  for t in range(x.shape[0]):
    for s in range(idx.shape[1]):
      if valid[t, s]:
        e = idx[t, s]
        g, u = x[t] @ weights["w_gate"][e], x[t] @ weights["w_up"][e]
        y[t] += w[t, s] * ((g / (1 + np.exp(-g)) * u) @ weights["w_down"][e])
  return y


@functools.lru_cache(maxsize=None)
def dispatcher(name, e, k):
  """A compiled dispatch backend over fixed random SwiGLU experts."""
  rng = np.random.default_rng(3)
  w = {
    n: (rng.standard_normal(s) / np.sqrt(s[-2])).astype(np.float32)
    for n, s in (("w_gate", (e, D, F)), ("w_up", (e, D, F)), ("w_down", (e, F, D)))
  }
  fn = functools.partial(swiglu_experts, jax.tree.map(jnp.asarray, w))
  cfg = moe_cfg(dispatch=name, num_experts=e, top_k=k, capacity={"factor": float(e) * 3})
  return jax.jit(functools.partial(get_dispatcher(name), expert_fn=fn, cfg=cfg)), w


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("label", list(ROUTERS))
def test_generic_invariants_and_dispatch_equivalence(label, train):
  e, k, t = 6, 2, 24
  out, _ = setup(label, e, k, train, t=t)
  r = out.routing
  assert r.expert_index.dtype == jnp.int32 and r.valid.dtype == jnp.bool_
  assert r.combine_weight.dtype == jnp.float32
  assert out.probs.dtype == jnp.float32 and out.logits.dtype == jnp.float32
  assert r.expert_index.shape == r.combine_weight.shape == r.valid.shape
  assert r.expert_index.shape[0] == t
  idx, w, valid = (np.asarray(a) for a in (r.expert_index, r.combine_weight, r.valid))
  assert ((idx[valid] >= 0) & (idx[valid] < e)).all()
  assert (w >= 0).all() and np.isfinite(w).all()
  for row in range(t):  # a token never names the same expert in two valid slots
    assert len(set(idx[row][valid[row]].tolist())) == valid[row].sum()
  np.testing.assert_allclose(np.asarray(out.probs).sum(1), 1.0, rtol=1e-5)
  for value in out.metrics.values():
    assert np.isfinite(np.asarray(value)).all()
  # both dispatch backends equal the per-token loop (nothing dropped)
  x = np.random.default_rng(4).standard_normal((t, D)).astype(np.float32)
  for name in ("dropless", "capacity"):
    dispatch, weights = dispatcher(name, e, k)
    y, metrics = dispatch(jnp.asarray(x), padded(r, e))
    assert float(metrics["dropped_fraction"]) == 0.0
    np.testing.assert_allclose(y, numpy_reference(x, r, weights), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("label", ["probmoe", "smooth_topk", "mahalanobis"])
def test_moe_layer_training_call(label):
  """The layer in training: rng reaches ProbMoE, the scalar eta state of SmoothSMoE and
  the covariance EMA of MP-MoE are carried as router state, the latter written back.
  (Gradients: ProbMoE's straight-through gradient is checked in test_probmoe.py.)"""
  cfg = moe_cfg(
    router=label,
    num_experts=4,
    top_k=2,
    expert_d_ff=6,
    **ROUTERS[label],
    loss_weights={
      "load_balance": 0.01,
      "dpsl": 0.1,
      **({"smooth_boundary": 0.1} if label == "smooth_topk" else {}),
    },
  )
  layer = MoELayer(8, cfg, rngs=nnx.Rngs(0), dtype=jnp.float32)
  x = jax.random.normal(jax.random.key(1), (2, 6, 8))

  def loss(layer):
    y, aux = layer(x, train=True, rng=jax.random.key(2))
    return jnp.sum(y**2) + aux["aux_loss"]

  assert np.isfinite(float(nnx.jit(loss)(layer)))
  if label == "mahalanobis":
    assert np.abs(np.asarray(layer.router_state["cooc_cov"][...])).sum() > 0


@pytest.mark.parametrize(
  "key,value",
  [
    ("probmoe.k_min", 3),
    ("probmoe.k_max", 9),
    ("probmoe.k_min", -1),
    ("smooth_topk.b", 0.0),
    ("smooth_topk.a", -1.0),
    ("smooth_topk.h_offset", -0.1),
    ("losses.smooth_boundary.alpha", -0.5),
    ("losses.dpsl.alpha", 0.0),
    ("mahalanobis.ema_decay", 1.0),
    ("mahalanobis.ridge", 0.0),
    ("as_coot.epsilon", 0.0),
    ("as_coot.iters", 0),
    ("as_coot.tau", -1.0),
    ("capacity_aware.gamma", 0.0),
    ("capacity_aware.gamma", -2.0),
    ("capacity_aware.expand_r", 0.5),
    ("capacity_aware.num_shards", 3),
    ("capacity_aware.num_shards", -1),
    ("sere.rho", 1.5),
    ("sere.rho", -0.1),
    ("sere.primary_slots", 0),
    ("topk_rounded.tile", 0),
    ("topk_rounded.tile", -4),
  ],
)
def test_bad_values_raise_config_error_naming_key_and_value(key, value):
  c = base_config()
  set_key(c.model.moe, key, value)
  if key == "probmoe.k_min" and value == 3:
    c.model.moe.probmoe.k_max = 2  # k_min > k_max
  if key == "probmoe.k_max":
    c.model.moe.probmoe.k_min = 1
  with pytest.raises(ConfigError) as err:
    validate_config(c)
  assert f"model.moe.{key}={value}" in str(err.value)


def test_router_specific_checks():
  c = base_config()
  c.model.moe.router, c.model.moe.sere.primary_slots = "sere", 3  # > top_k = 2
  with pytest.raises(ConfigError, match=r"model\.moe\.sere\.primary_slots=3"):
    validate_config(c)
  for router in ("probmoe", "smooth_topk", "mahalanobis", "as_coot", "capacity_aware", "sere"):
    c = base_config()
    c.model.moe.router = router
    validate_config(c)  # the defaults are valid
