"""Grouped matmul 'gather' (moejax/dispatch/token_gather.py) and when 'auto' takes
it: only for calls with no more (token, slot) assignments than experts (decode
steps), where the program then holds no sort; both sides of the threshold equal
the numpy per-token loop. (Every expert type through 'gather', with gradients,
is in tests/contract.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.dispatch import get_dispatcher
from moejax.dispatch.grouped_matmul import resolve_grouped_matmul
from moejax.experts import swiglu_experts
from moejax.routing import Routing
from tests.contract.dispatch_oracles import D, expert_weights, reference_loop
from tests.helpers import moe_cfg


def test_auto_resolves_to_gather_only_for_few_rows():
  assert resolve_grouped_matmul("auto", few_rows=True).name == "gather"
  assert resolve_grouped_matmul("auto", few_rows=False).name != "gather"
  assert resolve_grouped_matmul("loop", few_rows=True).name == "loop"  # only 'auto' switches


@pytest.mark.parametrize("tokens,sorts", [(4, False), (5, True), (40, True)])
def test_dropless_auto_sorts_nothing_for_few_rows_and_equals_the_per_token_loop(tokens, sorts):
  e, k = 8, 2  # 4 tokens x 2 slots = 8 assignments <= 8 experts; 5 x 2 > 8
  cfg = moe_cfg(num_experts=e, top_k=k, grouped_matmul="auto")
  rng = np.random.default_rng(tokens)
  index = np.stack([rng.choice(e, k, replace=False) for _ in range(tokens)]).astype(np.int32)
  valid = rng.random((tokens, k)) < 0.8
  routing = Routing(
    jnp.asarray(index), jnp.asarray(rng.random((tokens, k)), jnp.float32), jnp.asarray(valid)
  )
  x = rng.standard_normal((tokens, D)).astype(np.float32)
  weights = expert_weights(7, e)
  dispatch = functools.partial(
    get_dispatcher("dropless"),
    cfg=cfg,
    expert_fn=functools.partial(swiglu_experts, jax.tree.map(jnp.asarray, weights)),
  )
  program = str(jax.make_jaxpr(dispatch)(jnp.asarray(x), routing))
  assert (" sort[" in program) == sorts  # the sort primitive (not indices_are_sorted)
  y, metrics = jax.jit(dispatch)(jnp.asarray(x), routing)
  np.testing.assert_allclose(y, reference_loop(x, routing, weights), rtol=1e-5, atol=1e-6)
  assert float(metrics["dropped_fraction"]) == 0.0
