"""Configs saved by older moejax, brought up to today's schema: keys added since at
their defaults, flat part settings moved into their sections, the old OmniMoE
layout; and flattening a config to dotted keys. Below interop and train, which
both read stored configs."""

import ml_collections

from moejax.config import base_config, parts_with_settings
from moejax.models.structure import set_moe_layers


# Dicts whose keys are data, not schema: a saved value replaces the default whole.
OPEN_DICTS = ("loss_weights", "weights")  # model.moe.loss_weights, data.mix.weights


def with_defaults(saved: dict) -> dict:
  """A config dict saved by an older moejax, with the keys added since at their
  defaults (new sections default to off), so its checkpoint still restores and
  compares equal to the config that made it."""

  def merge(default, value):
    out = dict(default)
    for key, v in value.items():
      nested = isinstance(v, dict) and isinstance(out.get(key), dict)
      out[key] = merge(out[key], v) if nested and key not in OPEN_DICTS else v
    return out

  return merge(base_config().to_dict(), migrate_part_settings(migrate_legacy(saved)))


def migrate_legacy(saved: dict) -> dict:
  """A saved config in today's schema: the one model schema moved
  model.rope_theta to model.rope.theta, and the decoder configs of converted
  workdirs said max_position for max_seq_len and listed moe_layers; OmniMoE
  became the one MoE layer with router product_key (migrate_omnimoe)."""
  model = dict(saved.get("model", {}))
  if model.get("ffn_type") == "omnimoe":
    model = migrate_omnimoe(model)
  model.pop("omni", None)  # every config held the section until the one MoE layer
  if "rope_theta" in model:
    model["rope"] = {**model.get("rope", {}), "theta": model.pop("rope_theta")}
  if "max_position" in model:
    model["max_seq_len"] = model.pop("max_position")
  if "moe_layers" in model:
    layers = model.pop("moe_layers")
    model["moe"] = dict(model.get("moe", {}))
    model.setdefault("ffn_type", "moe")
    set_moe_layers(model, layers)
  return {**saved, "model": model}


def migrate_omnimoe(model: dict) -> dict:
  """ffn_type 'omnimoe' with its model.omni section (before the one MoE layer) as
  the MoE layer with router product_key, atomic experts and one shared expert."""
  model = dict(model)
  omni = {**OMNI_DEFAULTS, **model.pop("omni", {})}
  fused = omni["schedule"] == "naive"  # the atomic type's fused path is that schedule
  model["ffn_type"] = "moe"
  model["moe"] = {
    **model.get("moe", {}),
    **dict(
      router="product_key",
      experts="atomic",
      num_experts=omni["num_atomic_experts"],
      top_k=omni["top_k"],
      product_key={"per_axis_k": omni["per_axis_k"]},
      atomic={"activation": omni["activation"]},
      shared={"count": 1, "d_ff": omni["shared_d_ff"], "gate": False},
      loss_weights={},
      dispatch="dropless",
      grouped_matmul="fused" if fused else omni["grouped_matmul"],
      dropless={"tile": omni["tile"], "block": omni["block_rows"]},
    ),
  }
  return model


# model.omni as the last moejax with it saved it (for migrate_omnimoe).
OMNI_DEFAULTS = dict(
  num_atomic_experts=4096,
  top_k=32,
  per_axis_k=0,
  shared_d_ff=448,
  activation="silu",
  schedule="naive",
  grouped_matmul="tiled",
  tile=8,
  block_rows=512,
)


def model_config_from_dict(saved_model: dict) -> ml_collections.ConfigDict:
  """The `model` section of a stored config (any moejax version) in today's schema."""
  return ml_collections.ConfigDict(with_defaults({"model": saved_model})["model"])


def migrate_part_settings(saved: dict) -> dict:
  """Flat model.moe keys of older configs moved into the sections of the parts
  that declare them (legacy_keys): probmoe_k_min -> probmoe.k_min, dpsl_alpha ->
  losses.dpsl.alpha, dropless_tile -> dropless.tile, num_shared_experts ->
  shared.count."""
  moe = saved.get("model", {}).get("moe")
  if not isinstance(moe, dict):
    return saved
  for part in parts_with_settings():
    moe = part.migrate(moe)
  return {**saved, "model": {**saved["model"], "moe": moe}}


def flatten_config(d: dict, prefix: str = "", keep_empty: bool = False) -> dict:
  """{'a': {'b': 1}} -> {'a.b': 1}; lists become tuples so values compare and hash.
  keep_empty: an empty dict stays, as the value {} of its key (else it leaves no key:
  model.moe.loss_weights={} would read back as its non-empty default)."""
  out: dict = {}
  for key, value in d.items():
    if isinstance(value, dict) and (value or not keep_empty):
      out.update(flatten_config(value, f"{prefix}{key}.", keep_empty))
    else:
      out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
  return out
