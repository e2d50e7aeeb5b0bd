"""The loop paths (blocks.py) and the memory-efficient SonicMoE path (memeff.py):
block schedules tile every group once, every grouped matmul equals the per-token
loop, and dropless_memeff has the plain path's forward and gradients (x, expert
weights, router through the combine weights) without saving gathered rows."""

import contextlib
import functools
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.ad_checkpoint import print_saved_residuals
from jax.test_util import check_grads

from moejax.assignment.blocks import block_schedule, block_sizes
from moejax.assignment.layout import tile_layout
from moejax.dispatch import get_dispatcher
from moejax.errors import ConfigError
from moejax.experts import swiglu_experts
from moejax.routing import Routing, call_router
from tests.contract.dispatch_oracles import D, expert_weights, reference_loop
from tests.helpers import moe_cfg, random_logits

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def layout_and_schedule(routing, num_experts, tile, block, min_block):
  layout = tile_layout(routing, num_experts, tile)
  return layout, block_schedule(layout, block, min_block)


@settings(max_examples=20)  # each new shape compiles (suite budget)
@given(
  st.integers(0, 2**16),
  st.sampled_from([(1, 4, 32), (3, 16, 32), (4, 64, 32), (4, 64, 2), (12, 16, 8), (8, 8, 1)]),
  st.sampled_from([(40, 2, 4), (7, 3, 5)]),
)
def test_block_schedule_covers_each_group_once_up_to_the_granule(seed, tiles, shape):
  """Blocks cover each expert's rows rounded up to g = gcd(tile, min_block), each row
  once, by that expert's blocks; nothing else (the rest of the tile padding is skipped)."""
  tile, block, min_block = tiles
  t, s, e = shape
  rng = np.random.default_rng(seed)
  routing = Routing(
    jnp.asarray(rng.integers(0, e, (t, s)), jnp.int32),
    jnp.ones((t, s)),
    jnp.asarray(rng.random((t, s)) < 0.8),
  )
  layout, schedule = layout_and_schedule(routing, e, tile, block, min_block)
  g = int(np.gcd(tile, min_block))
  owner = np.full(layout.num_rows, -1)
  starts, counts = np.asarray(layout.padded_starts), np.asarray(layout.group_sizes)
  for j in range(e):
    owner[starts[j] : starts[j] + -(-counts[j] // g) * g] = j
  covered = np.full(layout.num_rows, -1)
  allowed = block_sizes(g, min(block, layout.num_rows))
  for p in schedule:
    assert p.rows in allowed
    for start, expert in zip(np.asarray(p.start)[: int(p.count)], np.asarray(p.expert)):
      assert (covered[start : start + p.rows] == -1).all()  # no row twice
      covered[start : start + p.rows] = expert
  np.testing.assert_array_equal(covered, owner)  # every row of e up to g once, by e's blocks
  # each row of an assignment lies in its expert's group
  idx = np.asarray(routing.expert_index).T.reshape(-1)
  valid = np.asarray(routing.valid).T.reshape(-1)
  rows = np.asarray(layout.row_of_assignment)
  np.testing.assert_array_equal(owner[rows[valid]], idx[valid])
  assert (rows[~valid] == layout.num_rows).all()


@pytest.mark.parametrize("matmul", ["auto", "fused", "loop", "tiled", "ragged_dot", "gmm"])
@pytest.mark.parametrize("tile,block,min_block", [(1, 4, 32), (3, 16, 32), (8, 16, 2)])
def test_every_grouped_matmul_equals_per_token_loop(matmul, tile, block, min_block):
  t, e, k = 30, 5, 2
  cfg = moe_cfg(
    num_experts=e,
    top_k=k,
    grouped_matmul=matmul,
    dropless={"tile": tile, "block": block, "min_block": min_block},
  )
  routing = call_router("topk", jnp.asarray(random_logits(1, t, e)), cfg).routing
  x = np.random.default_rng(2).standard_normal((t, D)).astype(np.float32)
  weights = expert_weights(3, e)
  fn = functools.partial(swiglu_experts, jax.tree.map(jnp.asarray, weights))
  for name in ("dropless", "dropless_memeff"):
    y, _ = jax.jit(functools.partial(get_dispatcher(name), expert_fn=fn, cfg=cfg))(
      jnp.asarray(x), routing
    )
    np.testing.assert_allclose(y, reference_loop(x, routing, weights), rtol=1e-5, atol=1e-5)


def layer_loss(dispatch, router="topk", t=48, e=6, k=2, tile=4, block=8, **cfg_kw):
  """loss(x, router_kernel, expert weights) of router + dispatch, and its inputs."""
  cfg = moe_cfg(
    router=router,
    dispatch=dispatch,
    num_experts=e,
    top_k=k,
    dropless={"tile": tile, "block": block, **cfg_kw.pop("dropless", {})},
    grouped_matmul="loop",
    **cfg_kw,
  )
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((t, D)), jnp.float32)
  router_kernel = jnp.asarray(rng.standard_normal((D, e)), jnp.float32)
  weights = jax.tree.map(jnp.asarray, expert_weights(1, e))
  proj = jnp.asarray(rng.standard_normal((t, D)), jnp.float32)

  def loss(x, router_kernel, weights):
    routing = call_router(router, x @ router_kernel, cfg, train=True).routing
    y, _ = get_dispatcher(dispatch)(x, routing, functools.partial(swiglu_experts, weights), cfg)
    return jnp.sum(y * proj)

  return loss, (x, router_kernel, weights)


@pytest.mark.parametrize(
  "router,cfg_kw",
  [
    ("topk", {}),
    ("topk", {"routing": {"renormalize": False}, "k": 3}),
    ("topk", {"dropless": {"min_block": 1}}),
    ("topk_rounded", {"topk_rounded": {"tile": 4, "mode": "up"}}),
    ("expert_choice", {"capacity": {"factor": 1.0}}),
  ],
)
def test_memeff_forward_and_gradients_equal_plain_dropless(router, cfg_kw):
  plain, args = layer_loss("dropless", router, **cfg_kw)
  memeff, _ = layer_loss("dropless_memeff", router, **cfg_kw)
  value, grads = jax.jit(jax.value_and_grad(plain, argnums=(0, 1, 2)))(*args)
  value_m, grads_m = jax.jit(jax.value_and_grad(memeff, argnums=(0, 1, 2)))(*args)
  np.testing.assert_allclose(value_m, value, rtol=1e-5)
  for name, got, want in zip(("x", "router", "experts"), grads_m, grads):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      scale = float(jnp.max(jnp.abs(w)))
      assert scale > 0, name  # the router gradient is not trivially zero
      np.testing.assert_allclose(g / scale, w / scale, rtol=0, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("min_block", [32, 1])
def test_memeff_gradients_match_finite_differences(min_block):
  """Independent of the plain path: float64 central differences, router included;
  min_block 1: blocks stop at each group's last row, the tile padding is skipped."""
  with jax.enable_x64(True):
    loss, args = layer_loss(
      "dropless_memeff", t=8, e=3, tile=4, block=4, dropless={"min_block": min_block}
    )
    args = jax.tree.map(lambda a: a.astype(jnp.float64), args)
    check_grads(jax.jit(loss), args, order=1, modes=["rev"], eps=1e-6, atol=1e-6, rtol=1e-6)


def saved_shapes(fn, *args):
  """Shapes of the residuals autodiff saves for fn's backward (print_saved_residuals)."""
  buffer = io.StringIO()
  with contextlib.redirect_stdout(buffer):
    print_saved_residuals(fn, *args)
  text = buffer.getvalue()
  return [
    tuple(int(v) for v in dims.split(",") if v) for dims in re.findall(r"\w+\[([\d,]*)\]", text)
  ], text


def test_memeff_saves_no_gathered_rows():
  t, e, k, tile, ffn = 64, 4, 2, 8, 12
  plain_loss, args = layer_loss("dropless", t=t, e=e, k=k, tile=tile)
  memeff_loss, _ = layer_loss("dropless_memeff", t=t, e=e, k=k, tile=tile)
  num_rows = (-(-t * k // tile) + e) * tile  # the tile-padded buffer (base.tile_layout)

  def gathered(shape):
    return len(shape) == 2 and shape[1] == D and shape[0] >= t * k

  plain, _ = saved_shapes(plain_loss, *args)
  memeff, text = saved_shapes(memeff_loss, *args)
  assert any(map(gathered, plain))  # the plain path saves [rows, d]: the check can fail
  assert not any(map(gathered, memeff)), text
  assert (num_rows, 2 * ffn) in memeff  # H, the pre-activations
  assert (t, D) in memeff  # the ungathered x


def test_fused_path_needs_swiglu_experts_and_auto_falls_back_to_loop():
  routing = Routing(jnp.zeros((3, 1), jnp.int32), jnp.ones((3, 1)), jnp.ones((3, 1), bool))

  def expert_fn(rows, matmul):
    return matmul(rows, jnp.ones((2, D, D)))

  for dispatch, matmul in (("dropless_memeff", "auto"), ("dropless", "fused")):
    cfg = moe_cfg(num_experts=2, top_k=1, dispatch=dispatch, grouped_matmul=matmul)
    with pytest.raises(ConfigError, match=f"model.moe.grouped_matmul='{matmul}'"):
      get_dispatcher(dispatch)(jnp.ones((3, D)), routing, expert_fn, cfg)
  cfg = moe_cfg(num_experts=2, top_k=1, grouped_matmul="auto")
  y, _ = jax.jit(lambda x: get_dispatcher("dropless")(x, routing, expert_fn, cfg))(
    jnp.ones((3, D))
  )  # one program, not one per operation
  np.testing.assert_allclose(y, np.full((3, D), D))
