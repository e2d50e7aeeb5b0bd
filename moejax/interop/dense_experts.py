"""Compressed experts as float SwiGLU weights, for an HF export.

transformers has SwiGLU experts only, so a model whose experts are of a
compressed type (moejax/experts/: 'quantized' codes, 'codebook' indices,
'factorised' Tucker factors) exports the dense weights its experts compute
with: each type's own reconstruction (DENSE below), w_gate, w_up [E, d, f]
and w_down [E, f, d] in float32, then cast to the export dtype. The model it
gives is the float ('swiglu') model with those weights; importing the export
gives that model back. Not silent: `for_export` returns a record whose `note`
the exporter writes to moejax_export.json in the export (EXPORT_RECORD) and
experiments.convert prints.

    m, params, rest, record = for_export(m, params, rest, dtype)   # record None: swiglu
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax.models.structure import moe_layer_indices
from moejax.experts import codebook, factorised, quantized
from moejax.experts.compressed import MATRICES
from moejax.models.decoder import abstract_model

EXPORT_RECORD = "moejax_export.json"


def _bits_text(arrays: list[dict], what: str) -> str:
  """'4-bit codes', or '2/3/4-bit codes (per expert)' when experts differ."""
  bits = sorted({int(b) for a in arrays for b in np.asarray(a["bits"]).ravel()})
  return "/".join(map(str, bits)) + f"-bit {what}" + (" (per expert)" if len(bits) > 1 else "")


def _group_text(group_size: int) -> str:
  return f"group {group_size}" if group_size else "one group per input dim"


def _quantized(layer) -> dict:
  return quantized.dense_weights(layer.experts.weights(jnp.float32), jnp.float32)


def _quantized_details(layers) -> str:
  s = layers[0].expert_settings
  return ", ".join(
    [
      _bits_text([layer.experts.arrays() for layer in layers], "codes"),
      _group_text(s["group_size"]),
    ]
    + (["symmetric"] if s["symmetric"] else [])
  )


def _codebook(layer) -> dict:
  rotation = layer.expert_settings["rotation"]
  return codebook.dense_weights(layer.experts.weights(jnp.float32), jnp.float32, rotation)


def _codebook_details(layers) -> str:
  s = layers[0].expert_settings
  arrays = [layer.experts.arrays() for layer in layers]
  if all("bits" in a for a in arrays):
    bits = _bits_text(arrays, "indices")
  else:  # one width for all: K = 2^bits centroids per group
    bits = f"{int(np.log2(np.shape(arrays[0]['w_gate_centroids'])[-1]))}-bit indices"
  return ", ".join(
    [bits, _group_text(s["group_size"])]
    + ([f"{s['rotation']} rotation"] if s["rotation"] != "none" else [])
  )


def _factorised(layer) -> dict:
  return {p: getattr(layer.experts, p).dense() for p in factorised.PROJECTIONS}


def _factorised_details(layers) -> str:
  experts = layers[0].experts
  return "Tucker ranks (expert, in, out) " + ", ".join(
    f"{factorised.SHORT[p]} {tuple(getattr(experts, p).ranks)}" for p in factorised.PROJECTIONS
  )


# expert type -> (verb, dense weights of one MoE layer, details of the stored form)
DENSE = {
  "quantized": ("dequantized", _quantized, _quantized_details),
  "codebook": ("dequantized", _codebook, _codebook_details),
  "factorised": ("reconstructed", _factorised, _factorised_details),
}


def _copy(tree):
  """New dicts all the way down, the same leaves (the caller's trees stay as they are)."""
  return jax.tree.map(lambda leaf: leaf, tree)


def for_export(m, params: dict, rest: dict, dtype: str | None):
  """(m, params, rest, record): unchanged with record None for experts HF holds
  (or no MoE layer); for a type of DENSE, the float model (experts 'swiglu')
  holding each layer's dense weights, in `dtype` (default: params['embed']'s),
  and the record {'stored_as', 'exported_as', 'dtype', 'details', 'note'}."""
  kind = m.moe.get("experts", "swiglu")
  layers = moe_layer_indices(m)
  if kind not in DENSE or not layers:
    return m, params, rest, None
  verb, dense, details = DENSE[kind]
  graphdef, _, _ = abstract_model(m)
  model = nnx.merge(graphdef, params, rest)
  moe = [model.blocks[i].ffn for i in layers]
  out_dtype = dtype or str(np.asarray(params["embed"]).dtype)
  cast = jnp.dtype(out_dtype)
  params, rest = _copy(params), _copy(rest)
  for i, layer in zip(layers, moe):
    weights = dense(layer)
    params["blocks"][i]["ffn"]["experts"] = {
      name: jnp.asarray(weights[name], jnp.float32).astype(cast) for name in MATRICES
    }
    rest.get("blocks", {}).get(i, {}).get("ffn", {}).pop("experts", None)
  float_m = ml_collections.ConfigDict(m.to_dict())
  float_m.moe.experts = "swiglu"
  text = details(moe)
  record = {
    "stored_as": kind,
    "exported_as": "swiglu",
    "dtype": out_dtype,
    "details": text,
    "note": f"experts {verb} from {kind!r} ({text}) to {out_dtype} for export: "
    "transformers has no such expert type",
  }
  return float_m, params, rest, record


def write_record(out_dir: str, record: dict) -> None:
  with open(os.path.join(out_dir, EXPORT_RECORD), "w") as f:
    json.dump({"experts": record}, f, indent=2)


def read_record(out_dir: str) -> dict | None:
  """The experts record of an export (None when it wrote none: float experts)."""
  path = os.path.join(out_dir, EXPORT_RECORD)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f).get("experts")
