"""GEMQ's per-expert costs (moejax/posttrain/gemq.py) against brute force: quantize
one expert alone, run the whole model, and weight the change of its block's
output by the per-token Fisher; then the allocation they feed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.models.capture import captured_forward
from moejax.posttrain import bit_allocation, gemq, quantize
from moejax.posttrain.taylor import token_gradients
from flax import nnx

from tests.helpers import host

BITS = (2, 3, 4, 8)


def block_output(graphdef, params, rest, tokens, block):
  _, _, outputs = captured_forward(nnx.merge(graphdef, params, rest), tokens)
  return np.asarray(outputs[("blocks", block, "ffn", "__call__")][0], np.float64).reshape(
    -1, outputs[("blocks", block, "ffn", "__call__")][0].shape[-1]
  )


@pytest.mark.integration
def test_costs_equal_the_fisher_weighted_change_of_the_block_output_with_one_expert_quantized(
  tiny_model,
):
  _, graphdef, state = tiny_model  # 2 MoE blocks of 8 experts, d 32
  params, rest = host(state.params), state.rest
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 24)), jnp.int32)
  blocks, costs = gemq.expert_costs(graphdef, params, rest, [tokens], BITS, group_size=8)
  assert blocks == [0, 1] and costs.shape == (2, 8, 4)
  dy, _, token_loss = token_gradients(graphdef, params, rest, tokens)
  n = token_loss.shape[0]
  for block, expert, j in ((0, 3, 0), (1, 5, 1), (1, 0, 3)):
    one = jax.tree.map(lambda leaf: leaf, params)
    experts = dict(one["blocks"][block]["ffn"]["experts"])
    for name in gemq.EXPERT_WEIGHTS:
      w = np.array(experts[name])
      w[expert] = quantize.dequantize(quantize.rtn(w[expert], BITS[j], 8))
      experts[name] = w
    one["blocks"][block]["ffn"]["experts"] = experts
    delta = block_output(graphdef, one, rest, tokens, block) - block_output(
      graphdef, params, rest, tokens, block
    )
    want = float(np.sum(np.square(n * np.asarray(dy[block], np.float64)) * np.square(delta)))
    np.testing.assert_allclose(
      costs[blocks.index(block), expert, j], want, rtol=1e-4
    )  # 8 bits: a float32 difference
    assert want > 0
  # more bits, less damage: every expert's cost falls from 2 to 8 bits
  assert np.all(costs[..., 0] > costs[..., 3])


def test_allocation_on_the_costs_spends_the_budget_where_the_costs_are(tiny_model):
  _, graphdef, state = tiny_model
  params, rest = host(state.params), state.rest
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 24)), jnp.int32)
  _, costs = gemq.expert_costs(graphdef, params, rest, [tokens], BITS, group_size=8)
  flat = costs.reshape(-1, len(BITS))
  picked = bit_allocation.allocate(flat, BITS, 3.0)
  uniform = np.full(len(flat), BITS.index(3))
  assert bit_allocation.average_bits(BITS, picked) <= 3.0
  assert bit_allocation.total_cost(flat, picked) <= bit_allocation.total_cost(flat, uniform)


def test_every_expert_matrix_of_the_named_blocks_is_quantized_asymmetric_by_default():
  """The candidates quantize w_gate, w_up and w_down (written out here, not read
  from gemq), each expert's slice on its own, on the asymmetric RTN grid when no
  symmetry is given; other blocks and other leaves are the same objects."""
  rng = np.random.default_rng(0)
  shapes = {"w_gate": (3, 8, 6), "w_up": (3, 8, 6), "w_down": (3, 6, 8)}

  def experts():
    return {name: rng.uniform(0.1, 1.0, shape).astype(np.float32) for name, shape in shapes.items()}

  params = {
    "blocks": {
      0: {"ffn": {"experts": experts(), "router": {"kernel": np.ones((8, 3))}}},
      1: {"ffn": {"experts": experts()}},
    }
  }
  before = {name: w.copy() for name, w in params["blocks"][0]["ffn"]["experts"].items()}
  new = gemq.quantized_experts(params, [0], bits=2, group_size=2)
  for name in ("w_gate", "w_up", "w_down"):
    w = params["blocks"][0]["ffn"]["experts"][name]
    want = np.stack(
      [quantize.dequantize(quantize.rtn(w[e], 2, 2, symmetric=False)) for e in range(3)]
    )
    np.testing.assert_array_equal(new["blocks"][0]["ffn"]["experts"][name], want)
    assert not np.allclose(want, w, atol=1e-3), name  # 2 bits: every matrix changes
    assert new["blocks"][1]["ffn"]["experts"][name] is params["blocks"][1]["ffn"]["experts"][name]
  assert (
    new["blocks"][0]["ffn"]["router"]["kernel"] is params["blocks"][0]["ffn"]["router"]["kernel"]
  )
  for name, w in before.items():  # the source is not changed in place
    np.testing.assert_array_equal(params["blocks"][0]["ffn"]["experts"][name], w)
