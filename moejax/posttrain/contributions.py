"""Per-expert contributions of every MoE layer on calibration tokens: the
statistics expert pruning reads.

For MoE layer l and expert e, Z_e = [g_{t,e} E_e(x_t)]_t over the calibration
tokens t (zero where the router did not send t to e); the routed output is
Y = sum_e Z_e (shared experts are not included: pruning keeps them). Captured:

  gram       G_ij = sum_t <g_ti E_i(x_t), g_tj E_j(x_t)>   [E, E], float64
  frequency  tokens routed to e                             [E]
  mass       sum of the router's combine weights g_{t,e}    [E]
  outputs    O_ij = sum_t <E_i(x_t), E_j(x_t)>, every expert run on every
             calibration token (not only its routed ones)  [E, E], float64:
             similarity of function, where G measures co-activation (G_ij = 0
             for experts never routed together)

The model's own routing and its own expert type are used (dropless layout, as
moejax/analysis/super_experts.py does), in float32 on device and summed over
batches in float64 on the host. A batch is one compiled program per model.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.models.capture import captured_forward, expert_outputs_on_tokens, routed_rows


@dataclasses.dataclass
class LayerStatistics:
  """One MoE layer's calibration statistics (module doc); `block` is its index."""

  block: int
  gram: np.ndarray
  frequency: np.ndarray
  mass: np.ndarray
  tokens: int
  step_score: np.ndarray | None = None  # Step's token-selective scores (posttrain/taylor.py)
  outputs: np.ndarray | None = None  # O of the module doc

  def __add__(self, other: "LayerStatistics") -> "LayerStatistics":
    outputs = (
      None if self.outputs is None or other.outputs is None else self.outputs + other.outputs
    )
    return LayerStatistics(
      self.block,
      self.gram + other.gram,
      self.frequency + other.frequency,
      self.mass + other.mass,
      self.tokens + other.tokens,
      None,
      outputs,
    )


def routed_contributions(layer, x_TxD, aux) -> jax.Array:
  """[T, E, d] float32: g_{t,e} E_e(x_t) for the slots the router kept, else 0."""
  num_experts = layer.cfg.num_experts
  r = routed_rows(layer, x_TxD, aux)
  out = jnp.zeros((x_TxD.shape[0], num_experts + 1, r["rows"].shape[-1]), jnp.float32)
  # padding rows carry expert E (sliced off) and weight 0
  return out.at[r["token"], r["expert"]].add(r["rows"] * r["weight"][:, None])[:, :num_experts]


@functools.partial(jax.jit, static_argnums=0)
def _batch_statistics(graphdef, params, rest, tokens):
  model = nnx.merge(graphdef, params, rest)
  _, aux, outputs = captured_forward(model, tokens)
  moe_blocks = [i for i, block in enumerate(model.blocks) if block.is_moe]
  out = []
  for i, layer_aux in zip(moe_blocks, aux["moe"]):
    layer = model.blocks[i].ffn
    x = outputs[("blocks", i, "ffn_norm", "__call__")].reshape(-1, model.cfg.d_model)
    z = routed_contributions(layer, x, layer_aux)
    e = layer.cfg.num_experts
    valid = layer_aux["valid"].reshape(-1)
    index = layer_aux["expert_index"].reshape(-1)
    weight = jnp.where(valid, layer_aux["combine_weight"].reshape(-1), 0.0)
    bound = layer.expert_type.bind(layer.experts.weights(jnp.float32), layer.cfg)
    every = expert_outputs_on_tokens(bound, x.astype(jnp.float32), e)  # [E, T, d]
    out.append(
      {
        "gram": jnp.einsum("ted,tfd->ef", z, z),
        "outputs": jnp.einsum("etd,ftd->ef", every, every),
        "frequency": jnp.zeros(e, jnp.float32).at[index].add(valid.astype(jnp.float32)),
        "mass": jnp.zeros(e, jnp.float32).at[index].add(weight.astype(jnp.float32)),
      }
    )
  return out


def layer_statistics(graphdef, params, rest, batches) -> list[LayerStatistics]:
  """Summed LayerStatistics of every MoE layer over token batches [B, L]."""
  model = nnx.merge(graphdef, params, rest)
  if model.cfg.scan_layers:
    raise ConfigError(
      "pruning reads the loop layout; convert a scanned model with "
      "moejax.models.decoder.unstack_layers"
    )
  if not any(block.is_moe for block in model.blocks):
    raise ConfigError("the checkpoint has no MoE layer: nothing to prune")
  blocks = [i for i, block in enumerate(model.blocks) if block.is_moe]
  total = None
  for tokens in batches:
    tokens = jnp.asarray(tokens)
    stats = _batch_statistics(graphdef, params, rest, tokens)
    layers = [
      LayerStatistics(
        block,
        np.asarray(s["gram"], np.float64),
        np.asarray(s["frequency"], np.float64),
        np.asarray(s["mass"], np.float64),
        int(tokens.size),
        outputs=np.asarray(s["outputs"], np.float64),
      )
      for block, s in zip(blocks, jax.device_get(stats))
    ]
    total = layers if total is None else [a + b for a, b in zip(total, layers)]
  if total is None:
    raise ConfigError("no calibration batch was given")
  return total


def save_statistics(path: str, stats: list[LayerStatistics]) -> None:
  """Write every layer's statistics to one .npz (block_<b>_gram, _frequency, _mass,
  _tokens, _outputs when captured): a calibration captured once, read again by
  load_statistics."""
  arrays = {}
  for layer in stats:
    for name in ("gram", "frequency", "mass", "tokens", "outputs"):
      if getattr(layer, name) is not None:
        arrays[f"block_{layer.block}_{name}"] = np.asarray(getattr(layer, name))
  with open(path, "wb") as f:
    np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy stub: **kwds vs allow_pickle


def load_statistics(path: str) -> list[LayerStatistics]:
  """The LayerStatistics that save_statistics wrote, in block order."""
  with np.load(path) as data:
    blocks = sorted({int(key.split("_")[1]) for key in data.files})
    return [
      LayerStatistics(
        b,
        data[f"block_{b}_gram"],
        data[f"block_{b}_frequency"],
        data[f"block_{b}_mass"],
        int(data[f"block_{b}_tokens"]),
        outputs=(data[f"block_{b}_outputs"] if f"block_{b}_outputs" in data.files else None),
      )
      for b in blocks
    ]


@functools.partial(jax.jit, static_argnums=(0, 3))
def _batch_deployed(graphdef, params, rest, new_graphdef, new_params, new_rest, tokens):
  model = nnx.merge(graphdef, params, rest)
  new = nnx.merge(new_graphdef, new_params, new_rest)
  _, _, outputs = captured_forward(model, tokens)
  out = {}
  for i, block in enumerate(model.blocks):
    if block.is_moe:
      x = outputs[("blocks", i, "ffn_norm", "__call__")]
      y = outputs[("blocks", i, "ffn", "__call__")][0].astype(jnp.float32)
      diff = new.blocks[i].ffn(x)[0].astype(jnp.float32) - y
      out[i] = jnp.sum(diff * diff)
  return out


def deployed_errors(
  graphdef, params, rest, new_m, new_params: dict, new_rest: dict, batches
) -> dict:
  """{MoE block: sum_t ||y'_t - y_t||^2} over token batches: y the source model's
  layer output, y' the pruned model's (config new_m) layer on the same input x_t,
  with its own routing among the kept experts (re-routed, gates renormalised) and
  its own weights (rescaled, merged or narrowed). Shared experts cancel."""
  from moejax.models.decoder import abstract_model

  new_graphdef = abstract_model(new_m)[0]
  total: dict[int, float] = {}
  for tokens in batches:
    errors = jax.device_get(
      _batch_deployed(
        graphdef, params, rest, new_graphdef, new_params, new_rest, jnp.asarray(tokens)
      )
    )
    for block, value in errors.items():
      total[block] = total.get(block, 0.0) + float(value)
  return total
