"""The model that holds a compression result (compress_pipeline.Compressed): its
config, with the experts' type and settings, and its parameters, with every
parameter but the experts copied from the float model."""

import ml_collections
import numpy as np

from moejax.errors import ConfigError
from moejax.posttrain import factorise
from moejax.posttrain.compress_pipeline import Compressed


def compressed_config(m, c: Compressed) -> ml_collections.ConfigDict:
  """The model config whose experts hold `c` (a copy of the float config `m`)."""
  if c.kind == "baseline":
    raise ConfigError(
      "the per-expert SVD baselines have no expert type: they are scored "
      "from their float weights (no --out)"
    )
  out = ml_collections.ConfigDict(m.to_dict())
  if c.kind == "factorised":
    cfg = ml_collections.ConfigDict({"model": out})
    return factorise.factorised_config(cfg, c.settings["ranks"]).model
  out.moe.experts = c.kind
  if c.kind not in out.moe:  # a config saved before the type was registered
    out.moe[c.kind] = {}
  out.moe[c.kind].update(c.settings)
  if out.moe.get("grouped_matmul") == "fused":
    out.moe.grouped_matmul = "auto"
  return out


def compressed_model(m, params: dict, rest: dict, c: Compressed):
  """(model config, params, rest) of the model holding `c`: every parameter but the
  experts copied from the float `params`; factorised ranks zero-padded to one
  triple per projection (the config holds one), which changes no output."""
  from flax import nnx
  from moejax.models.decoder import skeleton_decoder

  new_m = compressed_config(m, c)
  model = skeleton_decoder(new_m, rngs=nnx.Rngs(0))  # every variable is copied in
  split = nnx.split(model, nnx.Param, ...)
  graphdef, new_params, new_rest = split  # type: ignore[misc]  # nnx.split stub: any arity
  new_params = nnx.to_pure_dict(new_params)
  new_rest = nnx.to_pure_dict(new_rest)
  _copy_shared(params, new_params)
  _copy_shared(rest, new_rest)
  for block, arrays in c.arrays.items():
    if c.kind == "factorised":
      target = new_params["blocks"][block]["ffn"]["experts"]
      for p, factors in arrays.items():
        target[p] = _padded_factors(factors, target[p])
    else:
      experts = model.block_list()[block].ffn.experts
      experts.assign(arrays)
      new_rest["blocks"][block]["ffn"]["experts"] = {
        k: np.asarray(v) for k, v in nnx.to_pure_dict(nnx.state(experts)).items()
      }
  return new_m, new_params, new_rest


def _copy_shared(source: dict, target: dict) -> None:
  """target[k] = source[k] for every leaf path both hold (in place)."""
  for key, value in target.items():
    if key not in source:
      continue
    if isinstance(value, dict):
      if isinstance(source[key], dict):
        _copy_shared(source[key], value)
    elif np.shape(source[key]) == np.shape(value):
      target[key] = np.asarray(source[key])


def _padded_factors(factors: dict, like: dict) -> dict:
  """Tucker factors zero-padded to the shapes of `like` (exact: the padded core
  entries are 0)."""
  out = {}
  for name, value in factors.items():
    full = np.zeros(np.shape(like[name]), np.float32)
    full[tuple(slice(0, n) for n in value.shape)] = value
    out[name] = full
  return out
