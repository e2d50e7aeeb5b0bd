"""Both dispatch backends on the routings of real routers against the numpy per-token
loop (fp32, 1e-5). Every registered dispatcher on random routings, capacity drops and
invalid slots included, is in tests/contract/test_dispatch_contract.py (with the
oracles this file uses, tests/contract/dispatch_oracles.py).

Dropless runs at dropless.tile 1 (no padding: a row off by one lands in another
token's or expert's row), 3 (groups end mid-tile) and the default 128 (where the
padding would hide such a shift)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.dispatch import get_dispatcher
from moejax.experts import swiglu_experts
from moejax.routing import call_router
from tests.contract.dispatch_oracles import D, expert_weights, reference_loop
from tests.helpers import moe_cfg, random_logits

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

TILES = [1, 3, 128]  # 128: the default dropless.tile


@functools.cache
def jitted_dispatch(cfg):
  """cfg.dispatch as one jitted function of (x, routing, weights), compiled once per cfg
  and shape (eager dispatch compiles op by op: several times slower here)."""

  def dispatch(x, routing, weights):
    return get_dispatcher(cfg.dispatch)(x, routing, functools.partial(swiglu_experts, weights), cfg)

  return jax.jit(dispatch)


def dispatch(x, routing, weights, cfg):
  return jitted_dispatch(cfg)(jnp.asarray(x), routing, jax.tree.map(jnp.asarray, weights))


def run(dispatch_name, router_name, seed, t, e, k, **cfg_kw):
  cfg = moe_cfg(router=router_name, dispatch=dispatch_name, num_experts=e, top_k=k, **cfg_kw)
  logits = random_logits(seed, t, e)
  routing = call_router(router_name, jnp.asarray(logits), cfg).routing
  x = np.random.default_rng(seed + 7).standard_normal((t, D)).astype(np.float32)
  weights = expert_weights(seed, e)
  y, metrics = dispatch(x, routing, weights, cfg)
  return x, routing, weights, np.asarray(y), metrics, cfg


@pytest.mark.parametrize("router", ["topk", "sigmoid_bias", "expert_choice"])
@pytest.mark.parametrize("dispatch,tile", [("dropless", t) for t in TILES] + [("capacity", 128)])
def test_dispatch_equals_per_token_loop(dispatch, tile, router):
  # capacity.factor = E makes C >= T * k: nothing can drop.
  x, routing, weights, y, metrics, cfg = run(
    dispatch, router, 3, 24, 6, 2, capacity={"factor": 6.0}, dropless={"tile": tile}
  )
  assert float(metrics["dropped_fraction"]) == 0.0
  np.testing.assert_allclose(y, reference_loop(x, routing, weights), rtol=1e-5, atol=1e-5)
