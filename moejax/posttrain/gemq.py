"""GEMQ's per-expert quantization costs (ICML 2026, arXiv 2605.23078, code
jndeng/GEMQ), the input of the global bit allocation (bit_allocation.py).

For MoE block l, expert e and bit-width b, quantize only expert e (every other
weight stays float) and measure the change of the block's output h_t on the
calibration tokens, weighted by the empirical Fisher:

    c[l, e, b] = sum_t sum_d (N dL/dh_{t,d})^2 (h_t^{e@b} - h_t)_d^2,

L the mean next-token loss over the N predicted tokens (so N dL/dh_t is token
t's own gradient). Quantizing expert e of block l leaves that block's input and
routing unchanged, so h^{e@b} - h is exactly g_{t,e} (E_e^b(x_t) - E_e(x_t)) on
the tokens routed to e: one routed-contribution pass per bit-width, with every
expert quantized at b at once, gives the whole c[:, :, b]
(contributions.routed_contributions).

Progressive re-estimation (`source_params`, the float model): on the current
model (quantized experts, fine-tuned routers) the cost of expert e at b is
measured against the float expert's output on the current model's inputs,
routing and Fisher weights,

    c[l, e, b] = sum_t sum_d (N dL/dh_{t,d})^2 (g_{t,e} (E_e^b(x_t) - E_e(x_t)))_d^2,

never against the current quantized expert (which would make the current
allocation cost 0 and repeat it).

Quantizer: RTN per group of the input dimension (quantize.rtn); GEMQ
quantizes the chosen allocation with GPTQ, which the allocation's costs do not
use (a guess: the released code's cost pass was not read).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.posttrain import quantize
from moejax.posttrain.contributions import routed_contributions
from moejax.posttrain.taylor import token_gradients

EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")


def quantized_experts(
  params: dict,
  blocks,
  bits: int,
  group_size: int,
  symmetric: bool = False,
  source_params: dict | None = None,
) -> dict:
  """params with every expert weight of `blocks` replaced by the RTN
  dequantization at `bits` of the same weight in `source_params` (default
  params itself; each [d_in, d_out] slice quantized on its own)."""
  new = jax.tree.map(lambda leaf: leaf, params)  # fresh containers, shared leaves
  source = params if source_params is None else source_params
  for block in blocks:
    experts = dict(new["blocks"][block]["ffn"]["experts"])
    for name in EXPERT_WEIGHTS:
      w = np.asarray(source["blocks"][block]["ffn"]["experts"][name])
      experts[name] = np.stack(
        [quantize.dequantize(quantize.rtn(w_e, bits, group_size, symmetric)) for w_e in w]
      )
    new["blocks"][block]["ffn"]["experts"] = experts
  return new


def _with_experts(params: dict, blocks, source_params: dict) -> dict:
  """params with the expert weights of `blocks` taken from source_params."""
  new = jax.tree.map(lambda leaf: leaf, params)
  for block in blocks:
    new["blocks"][block]["ffn"]["experts"] = dict(source_params["blocks"][block]["ffn"]["experts"])
  return new


@functools.partial(jax.jit, static_argnums=0)
def _batch_costs(graphdef, params, reference_params, quantized_params, rest, tokens):
  """[blocks, E]: sum over this batch's tokens of (N dL/dh)^2 (Z^q - Z)^2, the
  gradients, inputs and routing of `params`, Z of `reference_params`' experts."""
  dy, moe, token_loss = token_gradients(graphdef, params, rest, tokens)
  n = token_loss.shape[0]
  model = nnx.merge(graphdef, reference_params, rest)
  quantized = nnx.merge(graphdef, quantized_params, rest)
  costs = []
  for block, (x, aux) in moe.items():
    delta = routed_contributions(quantized.blocks[block].ffn, x, aux) - routed_contributions(
      model.blocks[block].ffn, x, aux
    )  # [T, E, d]
    costs.append(jnp.einsum("td,ted->e", jnp.square(n * dy[block]), jnp.square(delta)))
  return jnp.stack(costs)


def expert_costs(
  graphdef,
  params: dict,
  rest: dict,
  batches,
  bits,
  group_size: int,
  symmetric: bool = False,
  source_params: dict | None = None,
) -> tuple[list[int], np.ndarray]:
  """(MoE blocks, c [blocks, E, len(bits)] float64) over the calibration token
  batches [B, L] (module doc); float params as pure dicts. With source_params
  (GEMQ's progressive re-estimation), `params` is the current (quantized,
  fine-tuned) model and each candidate is source_params' expert quantized at b,
  its change measured against source_params' float expert placed in the same
  model (module doc)."""
  model = nnx.merge(graphdef, params, rest)
  blocks = [i for i, block in enumerate(model.blocks) if block.is_moe]
  costs = np.zeros((len(blocks), model.cfg.moe.num_experts, len(bits)))
  reference = params if source_params is None else _with_experts(params, blocks, source_params)
  for j, b in enumerate(bits):
    quantized_params = quantized_experts(params, blocks, b, group_size, symmetric, source_params)
    for tokens in batches:
      costs[:, :, j] += np.asarray(
        _batch_costs(graphdef, params, reference, quantized_params, rest, jnp.asarray(tokens)),
        np.float64,
      )
  return blocks, costs
