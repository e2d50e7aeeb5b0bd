"""What each expert matrix sees on calibration tokens: the inputs that
GPTQ's Hessians, TD-MoE's whitening and CodeQuant's centroid fine-tuning read.

For MoE block l, on the calibration tokens the float model routes:

  inputs   X [T, d]        the layer's input (its ffn_norm output), every token
  rows     x_r [R, d]      the input of each routed (token, expert) pair, R = T k
  hidden   h_r [R, f]      silu(x_r W_gate_e) * (x_r W_up_e): w_down's input
  expert   e_r [R]         the expert of each row

so expert e's w_gate and w_up see the x_r with e_r = e, its w_down the h_r
(GPTQ: H = X_e^T X_e, Frantar et al. 2022; TD-MoE whitens by the layer's
pooled inputs). The model's own routing, dropless, float32 on device; rows
are gathered on the host and kept (zoo-s: 64 windows x 128 tokens x k = 4 is
32768 rows per layer, 16 MiB in float32).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.models.capture import captured_forward


@dataclasses.dataclass
class LayerInputs:
  """One MoE layer's calibration inputs (module doc), numpy float32."""

  block: int
  inputs: np.ndarray  # [T, d]
  rows: np.ndarray  # [R, d]
  hidden: np.ndarray  # [R, f]
  expert: np.ndarray  # [R] int
  _hessians: dict | None = dataclasses.field(default=None, repr=False, compare=False)

  def expert_rows(self, e: int, matrix: str) -> np.ndarray:
    """The inputs of expert e's `matrix` (w_gate, w_up: rows; w_down: hidden)."""
    source = self.hidden if matrix == "w_down" else self.rows
    return source[self.expert == e]

  def hessians(self, num_experts: int) -> dict:
    """{matrix: H [E, d_in, d_in]} float64, H_e = X_e^T X_e of each matrix's inputs;
    computed once per layer (every quantized arm of a calibration draw reads them)."""
    if self._hessians is None or len(self._hessians["w_gate"]) != num_experts:
      h_in = np.stack([_gram(self.expert_rows(e, "w_gate")) for e in range(num_experts)])
      h_hidden = np.stack([_gram(self.expert_rows(e, "w_down")) for e in range(num_experts)])
      self._hessians = {"w_gate": h_in, "w_up": h_in, "w_down": h_hidden}
    return self._hessians


def _gram(X) -> np.ndarray:
  X = np.asarray(X, np.float64)
  return X.T @ X


@functools.partial(jax.jit, static_argnums=0)
def _batch_inputs(graphdef, params, rest, tokens):
  from moejax.assignment.layout import tile_layout
  from moejax.dispatch.grouped_matmul import resolve_grouped_matmul
  from moejax.routing.base import Routing

  model = nnx.merge(graphdef, params, rest)
  _, aux, outputs = captured_forward(model, tokens)
  out = []
  blocks = [i for i, block in enumerate(model.blocks) if block.is_moe]
  for block, layer_aux in zip(blocks, aux["moe"]):
    layer = model.blocks[block].ffn
    e = layer.cfg.num_experts
    x = outputs[("blocks", block, "ffn_norm", "__call__")].reshape(-1, model.cfg.d_model)
    x = x.astype(jnp.float32)
    routing = Routing(layer_aux["expert_index"], layer_aux["combine_weight"], layer_aux["valid"])
    layout = tile_layout(routing, e, 1)
    matmul = resolve_grouped_matmul("ragged_dot").build(layout, layer.cfg)
    w = layer.experts.weights(jnp.float32)
    rows = x[layout.row_token]
    hidden = jax.nn.silu(matmul(rows, w["w_gate"])) * matmul(rows, w["w_up"])
    expert = jnp.where(routing.valid, routing.expert_index, e).T.reshape(-1)
    out.append(
      {"inputs": x, "rows": rows, "hidden": hidden, "expert": layout.row_values(expert, fill=e)}
    )
  return out


def capture(graphdef, params, rest, batches) -> list[LayerInputs]:
  """LayerInputs of every MoE layer over token batches [B, L]; a float SwiGLU model
  ('swiglu' experts, loop layout), pure-dict params and rest."""
  model = nnx.merge(graphdef, params, rest)
  blocks = [i for i, block in enumerate(model.blocks) if block.is_moe]
  if not blocks:
    raise ConfigError("the checkpoint has no MoE layer: nothing to compress")
  kinds = {model.blocks[b].ffn.expert_type.name for b in blocks}
  if kinds != {"swiglu"}:
    raise ConfigError(
      f"compression starts from float 'swiglu' experts; the model has {sorted(kinds)}"
    )
  parts: dict[int, dict[str, list[np.ndarray]]] = {
    b: {k: [] for k in ("inputs", "rows", "hidden", "expert")} for b in blocks
  }
  num_experts = model.cfg.moe.num_experts
  for tokens in batches:
    for block, got in zip(
      blocks, jax.device_get(_batch_inputs(graphdef, params, rest, jnp.asarray(tokens)))
    ):
      real = np.asarray(got["expert"]) < num_experts  # drop padding rows
      parts[block]["inputs"].append(np.asarray(got["inputs"]))
      for key in ("rows", "hidden", "expert"):
        parts[block][key].append(np.asarray(got[key])[real])
  joined = {b: {k: np.concatenate(v) for k, v in parts[b].items()} for b in blocks}
  return [
    LayerInputs(b, j["inputs"], j["rows"], j["hidden"], j["expert"]) for b, j in joined.items()
  ]
