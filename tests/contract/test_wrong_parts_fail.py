"""The acceptance proof: a deliberately wrong part, registered for one test only
(Registry.temporarily), fails the same contract checks every registered part
passes (expert types, dispatchers, grouped matmuls, routers, losses). Each broken
part differs from a correct one in one factor."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.dispatch import DISPATCHERS
from moejax.dispatch.base import CAPACITY_DROPS, DROPS_NOTHING, DispatcherSpec
from moejax.dispatch.capacity import CAPACITY, dispatch_capacity
from moejax.dispatch.grouped_matmul import GROUPED_MATMULS, GroupedMatmulSpec, tiled_matmul
from moejax.experts import EXPERT_TYPES
from moejax.experts.swiglu import SWIGLU, swiglu_fused
from moejax.losses import LOSSES
from moejax.losses.base import LossSpec
from moejax.losses.balance import load_balance_example, load_balance_loss
from moejax.routing import ROUTERS, RouterSpec
from moejax.routing.topk import route_top_k
from tests.contract.dispatch_oracles import check_dispatcher, check_grouped_matmul
from tests.contract.oracles import E, check_dispatch
from tests.contract.router_oracles import check_loss, check_router, router_outputs


def fused_without_combine_weight(weights, x, routing, cfg):
  """SwiGLU's fused path with every valid slot at weight 1: drops the w[t, s] factor."""
  ones = jnp.where(routing.valid, 1.0, 0.0).astype(routing.combine_weight.dtype)
  return swiglu_fused(weights, x, routing.replace(combine_weight=ones), cfg)


def fused_without_router_gradient(weights, x, routing, cfg):
  """The right forward, but no gradient reaches the combine weights (the router)."""
  frozen = routing.replace(combine_weight=jax.lax.stop_gradient(routing.combine_weight))
  return swiglu_fused(weights, x, frozen, cfg)


@pytest.mark.parametrize(
  "fused,fails_at",
  [(fused_without_combine_weight, "y"), (fused_without_router_gradient, "d combine_weight")],
)
def test_an_expert_type_with_a_wrong_fused_path_fails(fused, fails_at):
  wrong = dataclasses.replace(SWIGLU, name="swiglu_wrong_fused", fused=fused)
  with EXPERT_TYPES.temporarily(wrong.name, wrong):
    with pytest.raises(AssertionError, match=f"grouped_matmul fused: {fails_at}:"):
      check_dispatch(wrong, "dropless", "fused")
  assert wrong.name not in EXPERT_TYPES  # removed again


def test_the_fused_check_is_not_vacuous():
  check_dispatch(SWIGLU, "dropless", "fused")  # the correct part passes the same check


def test_a_grouped_matmul_that_shifts_experts_fails():
  def make_shifted(layout, cfg):  # each tile times the NEXT expert's weights
    return lambda rows, w: tiled_matmul((layout.tile_expert() + 1) % E, layout.tile, rows, w)

  with GROUPED_MATMULS.temporarily(
    "tiled_shifted", GroupedMatmulSpec("tiled_shifted", make=make_shifted)
  ):
    with pytest.raises(AssertionError, match="grouped_matmul tiled_shifted: y:"):
      check_dispatch(EXPERT_TYPES.get("atomic"), "dropless", "tiled_shifted")
  assert "tiled_shifted" not in GROUPED_MATMULS


def capacity_from_the_back(x, routing, expert_fn, cfg):
  """Capacity dispatch with the tokens in reverse order: each expert keeps its LAST
  assignments within a slot rank instead of its first."""
  flip = routing.replace(
    expert_index=routing.expert_index[::-1],
    combine_weight=routing.combine_weight[::-1],
    valid=routing.valid[::-1],
  )
  y, metrics = dispatch_capacity(x[::-1], flip, expert_fn, cfg)
  return y[::-1], metrics


@pytest.mark.parametrize(
  "spec",
  [
    DispatcherSpec("capacity_from_the_back", capacity_from_the_back, CAPACITY, CAPACITY_DROPS),
    DispatcherSpec("capacity_undeclared", dispatch_capacity, CAPACITY, DROPS_NOTHING),
  ],
  ids=["drops_the_wrong_tokens", "drops_but_declares_no_drops"],
)
def test_a_dispatcher_that_drops_the_wrong_assignments_fails(spec):
  capacity = {"factor": 0.25, "min": 1}  # drops on this routing (test_dispatch_contract.py)
  check_dispatcher("capacity", 3, (16, 4, 2), capacity=capacity)  # the correct part passes
  with DISPATCHERS.temporarily(spec.name, spec):
    with pytest.raises(AssertionError, match=f"dispatch {spec.name} .*: y:"):
      check_dispatcher(spec.name, 3, (16, 4, 2), capacity=capacity)
  assert spec.name not in DISPATCHERS


def test_a_grouped_matmul_on_unpadded_groups_fails():
  def make_unpadded(layout, cfg):  # group boundaries without the tile padding
    return lambda rows, w: jax.lax.ragged_dot(rows, w, layout.group_sizes)

  sizes, settings = [2, 0, 4, 1], {"dropless": {"tile": 3}}  # groups end mid-tile
  check_grouped_matmul("ragged_dot", sizes, 0, **settings)  # the correct part passes
  spec = GroupedMatmulSpec("ragged_unpadded", make=make_unpadded)
  with GROUPED_MATMULS.temporarily(spec.name, spec):
    with pytest.raises(AssertionError, match="grouped_matmul ragged_unpadded .*: out"):
      check_grouped_matmul(spec.name, sizes, 0, **settings)
  assert spec.name not in GROUPED_MATMULS


def test_a_router_that_breaks_its_promise_fails():
  def squared_top_k(logits, *, cfg, state, rng, train):  # weights p^2, not proportional to p
    out = route_top_k(logits, cfg=cfg, state=state, rng=rng, train=train)
    return out.replace(
      routing=out.routing.replace(combine_weight=jnp.square(out.routing.combine_weight))
    )

  spec = RouterSpec(
    "topk_squared", squared_top_k, promises=frozenset({"weights_proportional_to_probs"})
  )
  with ROUTERS.temporarily(spec.name, spec):
    with pytest.raises(AssertionError, match="not one multiple of its probs"):
      check_router(spec)
  assert spec.name not in ROUTERS


def test_a_router_with_an_out_of_range_expert_fails():
  def shifted_top_k(logits, *, cfg, state, rng, train):  # expert e -> e + 1: E is out of range
    out = route_top_k(logits, cfg=cfg, state=state, rng=rng, train=train)
    return out.replace(routing=out.routing.replace(expert_index=out.routing.expert_index + 1))

  spec = RouterSpec("topk_shifted", shifted_top_k)
  with ROUTERS.temporarily(spec.name, spec):
    with pytest.raises(AssertionError, match="expert_index outside"):
      check_router(spec)


def test_a_loss_that_misses_its_example_fails():
  def halved(out, cfg=None):
    return 0.5 * load_balance_loss(out, cfg)

  with LOSSES.temporarily("load_balance_halved", LossSpec("load_balance_halved", halved)):
    outputs = {"topk": router_outputs(ROUTERS.get("topk"))[True]}
    with pytest.raises(AssertionError, match="its declared example"):
      check_loss(
        "load_balance_halved", LOSSES.get("load_balance_halved"), outputs, load_balance_example
      )


# ---- post-training methods (tests/contract/posttrain_oracles.py)


def test_a_pruner_that_numbers_experts_from_one_fails():
  from moejax.posttrain.methods import PRUNERS
  from moejax.posttrain.parts import Method
  from tests.contract.posttrain_oracles import check_pruner

  def off_by_one(stats, m):  # the top m by frequency, numbered 1..E instead of 0..E-1
    return tuple(sorted(int(e) + 1 for e in np.argsort(-stats.frequency)[:m]))

  with PRUNERS.temporarily(
    "frequency_off_by_one", Method("frequency_off_by_one", "expert", off_by_one)
  ):
    with pytest.raises(AssertionError, match="pruner frequency_off_by_one: .*outside"):
      check_pruner("frequency_off_by_one")
  assert "frequency_off_by_one" not in PRUNERS
  check_pruner("frequency")  # the correct part passes the same check


def test_a_quantizer_that_truncates_fails():
  from moejax.posttrain.methods import QUANTIZERS
  from moejax.posttrain.parts import Method
  from moejax.posttrain.quantize import rtn
  from tests.contract.posttrain_oracles import check_quantizer

  def truncating(W, bits, group_size, hessians=None):  # floor(w / s), not round: rtn's grid
    out = []
    for w in np.asarray(W, np.float64):
      q = rtn(w, bits, group_size)
      scale, zero = (np.repeat(a, group_size, axis=0) for a in (q.scales, q.zero))
      codes = np.clip(np.floor(w / scale) + zero, 0, 2**bits - 1)
      out.append(Dequantized(((codes - zero) * scale).astype(np.float32)))
    return out

  method = Method("rtn_floor", "integer", truncating, flag="--quantizer")
  with QUANTIZERS.temporarily("rtn_floor", method):
    with pytest.raises(AssertionError, match="quantizer rtn_floor: at 8 bits an error of"):
      check_quantizer("rtn_floor")
  check_quantizer("rtn")


class Dequantized:
  def __init__(self, w_hat):
    self.w_hat = w_hat

  def dequantize(self):
    return self.w_hat


def test_a_decomposition_that_ignores_its_budget_fails():
  from moejax.posttrain import tucker
  from moejax.posttrain.methods import DECOMPOSITIONS
  from moejax.posttrain.parts import Method
  from tests.contract.posttrain_oracles import check_decomposition

  def full_rank_svd(W, budget, inputs=None, outputs=None):  # exact, but over any budget
    return tucker.per_expert_svd(W, min(np.shape(W)[1:]))

  with DECOMPOSITIONS.temporarily("svd_full", Method("svd_full", "per_expert", full_rank_svd)):
    with pytest.raises(AssertionError, match="decomposition svd_full: budget .* stores"):
      check_decomposition("svd_full")
  check_decomposition("svd")
