"""What a model computes inside, read without editing it: every module method's
output of one forward pass (`captured_forward`, nnx.capture), the inputs of its
MoE layers, and an MoE layer's experts run on the rows its router sent them
(`routed_rows`) or on every token (`expert_outputs_on_tokens`). The analyses and
post-training methods build on these."""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.assignment.layout import tile_layout
from moejax.assignment.routing import Routing
from moejax.dispatch.grouped_matmul import resolve_grouped_matmul


def captured_forward(model, tokens):
  """(logits, aux, outputs) of a full forward pass on `tokens`, where outputs maps
  each module path and method, e.g. ("blocks", 0, "ffn_norm", "__call__"), to
  what that method returned on its first call: nnx.capture's method_outputs,
  no model edits. Under jit, what the caller does not read is never computed."""
  (logits, aux, _), outputs = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(
    tokens
  )
  return logits, aux, {path: value.get_value()[0] for path, value in nnx.to_flat_state(outputs)}


def routed_rows(layer, x_TxD, aux) -> dict:
  """Every expert of one MoE layer run on the rows its router sent it (dropless
  row layout, float32): rows [R, d] expert outputs before the combine weight,
  and per row its token, expert (E on padding rows) and combine weight (0 there).

  x_TxD: the layer's input; aux: its aux (expert_index, combine_weight, valid)."""
  num_experts = layer.cfg.num_experts
  routing = Routing(aux["expert_index"], aux["combine_weight"], aux["valid"])
  layout = tile_layout(routing, num_experts, 1)
  bound = layer.expert_type.bind(layer.experts.weights(jnp.float32), layer.cfg)
  matmul = resolve_grouped_matmul("ragged_dot").build(layout, layer.cfg)
  expert = jnp.where(routing.valid, routing.expert_index, num_experts).T.reshape(-1)
  return {
    "rows": bound(x_TxD.astype(jnp.float32)[layout.row_token], matmul),
    "token": layout.row_token,
    "expert": layout.row_values(expert, fill=num_experts),
    "weight": layout.row_values(routing.masked_weight().T.reshape(-1)).astype(jnp.float32),
  }


def moe_layer_inputs(model, tokens) -> list[jax.Array]:
  """The inputs [B*L, d] of every MoE layer of the model on `tokens`: the
  outputs of each MoE block's ffn_norm (captured_forward)."""
  _, _, outputs = captured_forward(model, tokens)
  return [
    outputs[("blocks", i, "ffn_norm", "__call__")].reshape(-1, model.cfg.d_model)
    for i, block in enumerate(model.blocks)
    if block.is_moe
  ]


def expert_outputs_on_tokens(expert_fn, x_NxD: jax.Array, num_experts: int) -> jax.Array:
  """Every expert on every calibration token: [E, N, d].

  expert_fn(rows [E, C, d], matmul) is the layer's expert function (see
  moejax/experts); each expert receives all N rows.
  """
  rows = jnp.broadcast_to(x_NxD, (num_experts,) + x_NxD.shape)
  return expert_fn(rows, lambda r, w: jnp.einsum("eca,eab->ecb", r, w))
