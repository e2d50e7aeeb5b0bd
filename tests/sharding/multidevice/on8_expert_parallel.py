"""The expert-parallel dispatch against the single-device dispatchers and the
per-token reference loop (fp32, 1e-5): both exchanges, capacity and dropless,
gradients included, and a2a overflow drops against a numpy simulation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.dispatch import exchange as exchange_lib, expert_parallel, get_dispatcher
from moejax.experts import swiglu_experts
from moejax.experts.swiglu import SwiGLUExperts
from moejax.routing import call_router
from tests.contract.dispatch_oracles import D, expert_weights, reference_loop
from tests.helpers import moe_cfg, random_logits
from tests.sharding.multidevice.common import MESHES, layout_for

T, E, K = 64, 8, 2


@pytest.fixture(params=["fixed", "ragged"])
def exchange(request, monkeypatch):
  """'ragged' runs jax.lax.ragged_all_to_all's semantics emulated (XLA:CPU lacks the op)."""
  if request.param == "ragged":
    monkeypatch.setattr(exchange_lib, "ragged_all_to_all", exchange_lib.emulated_ragged_all_to_all)
  return request.param


def problem(seed, skew=0.0, factor=1.25, **cfg_kw):
  capacity = {"factor": factor, "min": 1}
  cfg = moe_cfg(num_experts=E, top_k=K, dropless={"tile": 8}, capacity=capacity, **cfg_kw)
  logits = random_logits(seed, T, E)
  logits[:, 0] += skew  # skew > 0 overloads expert 0 (on peer 0)
  routing = call_router("topk", jnp.asarray(logits), cfg).routing
  x = np.random.default_rng(seed + 1).standard_normal((T, D)).astype(np.float32)
  weights = jax.tree.map(jnp.asarray, expert_weights(seed, E))
  return cfg, routing, jnp.asarray(x), weights


def single_device(cfg, x, routing, weights):
  return get_dispatcher(cfg.dispatch)(x, routing, functools.partial(swiglu_experts, weights), cfg)


def on_mesh(cfg, x, routing, weights, layout):
  return expert_parallel.expert_parallel_dispatch(
    x, routing, weights, SwiGLUExperts.LOGICAL_AXES, swiglu_experts, cfg, layout
  )


def loss_and_grads(dispatch_fn):
  """(y, metrics) and d/d(x, combine weights, expert weights) of sum(y * proj)."""
  proj = jax.random.normal(jax.random.key(3), (T, D))

  def loss(x, combine_weight, weights, routing):
    y, metrics = dispatch_fn(x, routing.replace(combine_weight=combine_weight), weights)
    return jnp.sum(y * proj), (y, metrics)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


@functools.cache
def single_device_result(dispatch):
  cfg, routing, x, weights = problem(0, dispatch=dispatch, factor=1.0)
  return loss_and_grads(lambda x_, r, w: single_device(cfg, x_, r, w))(
    x, routing.combine_weight, weights, routing
  )


# Each exchange meets each dispatch and each mesh once (compiles are the cost here).
@pytest.mark.parametrize(
  "dispatch,mesh,exchange",
  [
    ("dropless", "data2_expert4", "fixed"),
    ("capacity", "fsdp2_expert2_tensor2", "fixed"),
    ("dropless", "fsdp2_expert2_tensor2", "ragged"),
    ("capacity", "data2_expert4", "ragged"),
  ],
  indirect=["exchange"],
)
def test_expert_parallel_equals_single_device(dispatch, mesh, exchange):
  cfg, routing, x, weights = problem(0, dispatch=dispatch, factor=1.0)
  layout = layout_for(MESHES[mesh], exchange)
  (_, (y1, m1)), g1 = single_device_result(dispatch)
  (_, (yn, mn)), gn = loss_and_grads(lambda x_, r, w: on_mesh(cfg, x_, r, w, layout))(
    x, routing.combine_weight, weights, routing
  )
  np.testing.assert_allclose(yn, y1, rtol=1e-5, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), gn, g1)
  np.testing.assert_allclose(float(mn["dropped_fraction"]), float(m1["dropped_fraction"]))
  assert float(mn["a2a_overflow_fraction"]) == 0.0
  if dispatch == "capacity":
    assert float(m1["dropped_fraction"]) > 0.0  # the test exercises capacity drops
    assert float(mn["capacity"]) == float(m1["capacity"])


def simulated_a2a_keep(routing, exchange, rows_per_peer, data=2, peers=4):
  """Which assignments the exchange delivers, replayed in numpy on the data=2 x expert=4
  mesh: token shard s = (data d, peer i) sorts its assignments by expert (slot-major within
  an expert); 'fixed' keeps the first R per destination peer, 'ragged' packs the
  sources' chunks in peer order into n_ep * R receive rows."""
  index, valid = np.asarray(routing.expert_index), np.asarray(routing.valid)
  t_loc, local_experts = T // (data * peers), E // peers
  keep = np.zeros_like(valid)
  for d in range(data):
    order, pair = {}, np.zeros((peers, peers), int)
    for i in range(peers):
      tokens = range((d * peers + i) * t_loc, (d * peers + i + 1) * t_loc)
      rows = sorted((index[t, s], s, t) for s in range(K) for t in tokens if valid[t, s])
      order[i] = rows
      for e, _, _ in rows:
        pair[i, e // local_experts] += 1
    landing = np.cumsum(pair, 0) - pair
    for i in range(peers):
      seen = np.zeros(peers, int)
      for e, s, t in order[i]:
        j = e // local_experts
        limit = (
          rows_per_peer
          if exchange == "fixed"
          else np.clip(peers * rows_per_peer - landing[i, j], 0, pair[i, j])
        )
        keep[t, s] = seen[j] < limit
        seen[j] += 1
  return keep


def test_overflow_drops_are_counted_and_contribute_nothing(exchange):
  factor = 0.5  # R = ceil(0.5 * 8 tokens * 2 / 4 peers) = 2 rows per peer
  cfg, routing, x, weights = problem(1, skew=3.0, dispatch="dropless")
  layout = layout_for(MESHES["data2_expert4"], exchange, a2a_capacity_factor=factor)
  y, metrics = jax.jit(lambda x_: on_mesh(cfg, x_, routing, weights, layout))(x)
  keep = simulated_a2a_keep(routing, exchange, rows_per_peer=2)
  overflow = 1 - keep.sum() / (T * K)
  assert overflow > 0.2, overflow  # the skew overflows the buffers
  np.testing.assert_allclose(float(metrics["a2a_overflow_fraction"]), overflow, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["dropped_fraction"]), overflow, rtol=1e-6)
  np.testing.assert_allclose(
    y, reference_loop(x, routing, jax.tree.map(np.asarray, weights), keep), rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize("skew", [0.0, 50.0])  # 50: every token on expert 0 (RepetitionCurse)
def test_busiest_device_rows_follow_the_latency_model(skew):
  """The most rows any device's experts run = analysis/repetition.device_rows's
  maximum: experts in 4 contiguous blocks, tokens in 2 contiguous data groups."""
  from moejax.analysis import repetition

  cfg, routing, x, weights = problem(2, skew=skew, dispatch="dropless")
  layout = layout_for(MESHES["data2_expert4"])
  _, metrics = jax.jit(lambda x_: on_mesh(cfg, x_, routing, weights, layout))(x)
  rows = repetition.device_rows(
    routing.expert_index, routing.valid, E, expert_shards=4, token_groups=2
  )
  assert float(metrics["busiest_device_rows"]) == rows.max()
  if skew:  # each data group's 32 tokens all send a row to block 0: 32 vs 128 / 8 = 16
    assert repetition.busiest_device(rows) >= 2.0
