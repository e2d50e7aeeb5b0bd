"""The router and loss half of the contract (tests/contract/oracles.py holds the
expert and dispatch half): the Routing contract (moejax/routing/base.py) at T_R
tokens, E_R experts (a 4 x 4 grid for product keys), top-2, with the default
config otherwise (small tiles). A router with its own projection routes its
projection of fixed token features x [T_R, D]. check_router and check_loss raise
AssertionError naming the part and what differs; test_router_contract.py calls them
for every registered router and loss, test_wrong_parts_fail.py shows they reject
broken ones.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax.dispatch import DISPATCHERS
from moejax.errors import ConfigError
from moejax.experts import EXPERT_TYPES
from moejax.losses import loss_config
from moejax.routing import get_router as routing_spec, router_config
from moejax.routing.base import PROMISES
from tests.contract.oracles import (
  D,
  assert_close,
  contract_cfg,
  f64,
  per_token_loop,
  random_weights,
)


T_R, E_R, K_R = 16, 16, 2


def router_cfg(name: str) -> ml_collections.FrozenConfigDict:
  """The contract's MoE section for router `name` (no loss weights for a router
  without probs, which config validation requires)."""
  no_losses = {} if routing_spec(name).gives_probs else {"loss_weights": {}}
  return contract_cfg(
    router=name,
    num_experts=E_R,
    top_k=K_R,
    capacity=dict(factor=1.25),
    dropless=dict(tile=4),
    topk_rounded=dict(tile=4),
    **no_losses,
  )


@functools.cache
def router_outputs(spec) -> dict:
  """{train: RouterOutput} of this router on fixed logits, or on its projection of
  fixed features (one compile for both)."""
  cfg = router_config(spec, router_cfg(spec.name))
  if spec.projection is None:
    logits = jnp.asarray(2.0 * np.random.default_rng(3).standard_normal((T_R, E_R)), jnp.float32)
  else:
    x = jnp.asarray(np.random.default_rng(3).standard_normal((T_R, D)), jnp.float32)
    params = spec.projection.init(jax.random.key(5), D, E_R, cfg)
    assert set(params) == set(spec.projection.logical_axes), f"{spec.name}: projection axes"
    logits = spec.projection.apply(params, x, cfg)

  def both(logits, state, rng):
    return {
      train: spec.route(logits, cfg=cfg, state=state, rng=rng, train=train)
      for train in (False, True)
    }

  return jax.jit(both)(logits, spec.initial_state(E_R), jax.random.key(0))


@functools.cache
def router_dispatch():
  """(jitted dispatch of a Routing, its expert type, weights, x): the default
  dispatcher, grouped matmul and expert type at the router shapes."""
  cfg = router_cfg("topk")
  expert_type = EXPERT_TYPES.get(cfg.experts)
  weights = random_weights(
    jax.eval_shape(lambda: expert_type.build(E_R, D, cfg, rngs=nnx.Rngs(0)).weights(jnp.float32)),
    seed=2,
  )
  x = jnp.asarray(np.random.default_rng(4).standard_normal((T_R, D)), jnp.float32)
  dispatch = DISPATCHERS.get(cfg.dispatch)
  run = jax.jit(
    lambda x, routing, weights: dispatch(x, routing, expert_type.bind(weights, cfg), cfg)[0]
  )
  options = expert_type.parse(cfg)
  loop = jax.jit(
    lambda weights, x, r: per_token_loop(
      expert_type.expert, weights, x, r.expert_index, r.combine_weight, r.valid, options
    )
  )
  return run, loop, weights, x


def check_routing(name: str, out, promises=frozenset(), gives_probs=True) -> None:
  """A RouterOutput is well formed (and keeps the router's promises)."""
  r = out.routing
  index, weight, valid = (np.asarray(a) for a in (r.expert_index, r.combine_weight, r.valid))
  assert index.ndim == 2 and index.shape[0] == T_R, f"{name}: expert_index {index.shape}"
  assert weight.shape == index.shape == valid.shape, f"{name}: slot arrays differ in shape"
  assert index.dtype == np.int32 and valid.dtype == np.bool_, f"{name}: dtypes"
  assert weight.dtype == np.float32, f"{name}: combine_weight is {weight.dtype}"
  assert ((0 <= index) & (index < E_R)).all(), f"{name}: expert_index outside [0, {E_R})"
  assert np.isfinite(weight).all(), f"{name}: combine_weight not finite"
  for t in range(T_R):
    chosen = index[t][valid[t]]
    assert len(set(chosen.tolist())) == len(chosen), f"{name}: token {t} names {chosen} twice"
  if r.max_valid is not None:
    assert valid.sum() <= r.max_valid, f"{name}: {valid.sum()} valid > max_valid {r.max_valid}"
  for key, value in {**out.metrics, **out.state}.items():
    assert np.isfinite(np.asarray(value)).all(), f"{name}: metric/state {key} not finite"
  assert set(promises) <= PROMISES, f"{name}: unknown promises {set(promises) - PROMISES}"
  if not gives_probs:  # routers that never form [T, E] (RouterSpec.gives_probs)
    assert out.probs is None and out.logits is None and not promises, (
      f"{name}: gives_probs=False, yet probs/logits or promises"
    )
    return
  probs, logits = np.asarray(out.probs), np.asarray(out.logits)
  assert probs.shape == logits.shape == (T_R, E_R), f"{name}: probs/logits shape"
  assert probs.dtype == logits.dtype == np.float32, f"{name}: probs/logits dtype"
  assert np.isfinite(logits).all() and np.isfinite(probs).all(), f"{name}: probs not finite"
  assert (probs >= 0).all(), f"{name}: negative probs"
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5, err_msg=f"{name}: probs rows")
  if "weights_proportional_to_probs" in promises:
    for t in range(T_R):
      if valid[t].any():
        c = weight[t][valid[t]] / probs[t, index[t][valid[t]]]
        assert (c > 0).all(), f"{name}: token {t} weight/probs {c}"
        np.testing.assert_allclose(
          c,
          c[0],
          rtol=1e-5,
          err_msg=f"{name}: token {t} weights are not one multiple of its probs (promised)",
        )


def check_router(spec) -> None:
  """Both modes: well-formed Routing, and dispatching it equals the per-token loop."""
  run, loop, weights, x = router_dispatch()
  for train, out in router_outputs(spec).items():
    name = f"router {spec.name} (train={train})"
    check_routing(name, out, spec.promises, spec.gives_probs)
    r = out.routing
    with jax.enable_x64(True):
      want = np.asarray(loop(f64(weights), f64(x), r.replace(combine_weight=f64(r.combine_weight))))
    assert_close(f"{name}: dispatch of its Routing", run(x, r, weights), want)


# ---------------------------------------------------------------------------
# Losses.


def check_loss(name: str, loss, outputs: dict, example=None, step_stats=None) -> None:
  """A finite float32 scalar on every router output the loss accepts (it raises
  ConfigError for the others; at least one accepted), a finite gradient (probs
  and logits) on the first accepted, its step statistics if it declares them
  (check_step_stats) and its declared hand-worked example."""
  cfg = loss_config(loss, router_cfg("topk"))
  accepted = []
  for router, out in outputs.items():
    if out.probs is None:  # gives_probs=False: no loss applies (config validation refuses)
      continue
    try:
      value = loss(out, cfg)
    except ConfigError:
      continue
    accepted.append(out)
    value = np.asarray(value)
    assert value.shape == () and value.dtype == np.float32, f"loss {name} on {router}: {value!r}"
    assert np.isfinite(value), f"loss {name} on {router}: {value}"
  assert accepted, f"loss {name} accepts no registered router's output"
  out = accepted[0]
  grads = jax.jit(
    jax.grad(
      lambda probs, logits: loss(out.replace(probs=probs, logits=logits), cfg), argnums=(0, 1)
    )
  )(out.probs, out.logits)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads), f"loss {name}: gradient"
  if step_stats is not None:
    check_step_stats(name, loss, step_stats, out, cfg)
  if example is not None:
    out, example_cfg, expected = example()
    got = float(loss(out, example_cfg))
    np.testing.assert_allclose(
      got, expected, rtol=1e-5, atol=1e-7, err_msg=f"loss {name}: its declared example"
    )


def check_step_stats(name, loss, step_stats, out, cfg, parts: int = 4) -> None:
  """A loss with step_stats (moejax/losses/base.py): on `parts` strided groups of
  the tokens, each given the stats summed over all groups, the mean loss and its
  gradient (probs, logits) are the loss and gradient of all the tokens."""

  def part(out, m):
    return out.replace(
      routing=jax.tree.map(lambda a: a[m::parts], out.routing),
      probs=out.probs[m::parts],
      logits=out.logits[m::parts],
    )

  summed = jax.tree.map(lambda *xs: sum(xs), *[step_stats(part(out, m), cfg) for m in range(parts)])

  def whole(probs, logits):
    return loss(out.replace(probs=probs, logits=logits), cfg)

  def accumulated(probs, logits):
    new = out.replace(probs=probs, logits=logits)
    return sum(loss(part(new, m), cfg, step_stats=summed) for m in range(parts)) / parts

  for got, want in zip(
    *[
      jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(out.probs, out.logits)
      for f in (accumulated, whole)
    ]
  ):
    np.testing.assert_allclose(
      jax.tree.leaves(got),
      jax.tree.leaves(want),
      rtol=1e-6,
      atol=1e-7,
      err_msg=f"loss {name}: step statistics",
    )
