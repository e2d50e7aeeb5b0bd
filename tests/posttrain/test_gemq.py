"""GEMQ's per-expert costs (moejax/posttrain/gemq.py) against brute force: quantize
one expert alone, run the whole model, and weight the change of its block's
output by the per-token Fisher; then the allocation they feed."""
import jax
import jax.numpy as jnp
import numpy as np

from configs import lm_shakespeare_moe
from moejax.analysis.router_inference import captured_forward
from moejax.posttrain import bit_allocation, gemq, quantize
from moejax.posttrain.taylor import token_gradients
from moejax.train.loop import init_state
from flax import nnx

BITS = (2, 3, 4, 8)


def tiny():
  config = lm_shakespeare_moe.get_config("size=tiny")  # 2 MoE blocks of 8 experts, d 32
  graphdef, state, _ = init_state(config)
  return config, graphdef, jax.tree.map(np.asarray, state.params), state.rest


def block_output(graphdef, params, rest, tokens, block):
  _, _, outputs = captured_forward(nnx.merge(graphdef, params, rest), tokens)
  return np.asarray(outputs[("blocks", block, "ffn", "__call__")][0], np.float64).reshape(
      -1, outputs[("blocks", block, "ffn", "__call__")][0].shape[-1])


def test_costs_equal_the_fisher_weighted_change_of_the_block_output_with_one_expert_quantized():
  config, graphdef, params, rest = tiny()
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
    delta = (block_output(graphdef, one, rest, tokens, block)
             - block_output(graphdef, params, rest, tokens, block))
    want = float(np.sum(np.square(n * np.asarray(dy[block], np.float64)) * np.square(delta)))
    np.testing.assert_allclose(costs[blocks.index(block), expert, j], want, rtol=1e-4)  # 8 bits: a float32 difference
    assert want > 0
  # more bits, less damage: every expert's cost falls from 2 to 8 bits
  assert np.all(costs[..., 0] > costs[..., 3])


def test_allocation_on_the_costs_spends_the_budget_where_the_costs_are():
  config, graphdef, params, rest = tiny()
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 24)), jnp.int32)
  _, costs = gemq.expert_costs(graphdef, params, rest, [tokens], BITS, group_size=8)
  flat = costs.reshape(-1, len(BITS))
  picked = bit_allocation.allocate(flat, BITS, 3.0)
  uniform = np.full(len(flat), BITS.index(3))
  assert bit_allocation.average_bits(BITS, picked) <= 3.0
  assert bit_allocation.total_cost(flat, picked) <= bit_allocation.total_cost(flat, uniform)
