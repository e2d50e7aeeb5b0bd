"""Checkpoints written before a config section existed still restore and compare equal."""

import pytest

from moejax.config import base_config, parts_with_settings
from moejax.errors import ConfigError
from moejax.migrate import model_config_from_dict, with_defaults
from moejax.train.checkpoint import config_mismatch
from moejax.train.sweep import apply_overrides
from moejax.validation import validate_config


def old_schema(config: dict) -> dict:
  """The dict an older moejax saved: without the `model.l3` section and a part's section."""
  saved = {**config, "model": {k: v for k, v in config["model"].items() if k != "l3"}}
  saved["model"]["moe"] = {k: v for k, v in config["model"]["moe"].items() if k != "sere"}
  saved["model"]["moe"]["loss_weights"] = {"z_loss": 1e-3}
  return saved


def test_missing_keys_get_defaults_and_open_dicts_are_kept_whole():
  current = base_config()
  current.model.moe.loss_weights = {"z_loss": 1e-3}
  upgraded = with_defaults(old_schema(current.to_dict()))
  assert upgraded["model"]["l3"] == base_config().model.l3.to_dict()
  assert upgraded["model"]["moe"]["sere"] == base_config().model.moe.sere.to_dict()
  # loss_weights is data: the saved dict is not merged with the default one.
  assert upgraded["model"]["moe"]["loss_weights"] == {"z_loss": 1e-3}
  assert config_mismatch(upgraded["model"], current.to_dict()["model"]) == []
  # A value the old run did set still counts.
  changed = old_schema(current.to_dict())
  changed["model"]["moe"]["top_k"] = 3
  diffs = config_mismatch(with_defaults(changed)["model"], current.to_dict()["model"])
  assert len(diffs) == 1 and diffs[0].startswith("moe.top_k")


def test_configs_of_the_two_old_model_schemas_migrate_to_the_one_schema():
  """Issue 12 merged TransformerLM's schema (model.rope_theta) and the HF
  decoder's (max_position, an explicit moe_layers list) into one."""
  from moejax.models.structure import moe_layer_indices

  trained = base_config().to_dict()["model"]
  trained["rope_theta"] = trained.pop("rope")["theta"] * 2
  m = model_config_from_dict(trained)
  assert m.rope.theta == 2 * base_config().model.rope.theta and "rope_theta" not in m

  converted = {
    k: v
    for k, v in base_config().to_dict()["model"].items()
    if k not in ("max_seq_len", "ffn_type")
  }
  converted.update(num_layers=6, max_position=4096, moe_layers=[1, 2, 4, 5])
  m = model_config_from_dict(converted)
  assert m.max_seq_len == 4096 and moe_layer_indices(m) == [1, 2, 4, 5]
  converted["moe_layers"] = []
  assert moe_layer_indices(model_config_from_dict(converted)) == []


# Every flat model.moe key that moved into a dispatcher's, grouped matmul's, the
# shared expert's or the routing section: (section, key, a non-default value).
MOVED = {
  "dropless_tile": ("dropless", "tile", 64),
  "dropless_block": ("dropless", "block", 256),
  "dropless_min_block": ("dropless", "min_block", 64),
  "capacity_factor": ("capacity", "factor", 2.0),
  "min_capacity": ("capacity", "min", 1),
  "gmm_backend": ("gmm", "backend", "reference"),
  "num_shared_experts": ("shared", "count", 2),
  "shared_d_ff": ("shared", "d_ff", 64),
  "shared_expert_gate": ("shared", "gate", True),
  "renormalize": ("routing", "renormalize", False),
  "routed_scaling_factor": ("routing", "routed_scaling_factor", 2.5),
  "bias_update_rate": ("routing", "bias_update_rate", 0.0),
  "num_groups": ("routing", "num_groups", 4),
  "topk_groups": ("routing", "topk_groups", 2),
  "router_jitter": ("routing", "jitter", 0.1),
  "router_init_scale": ("routing", "init_scale", 0.5),
}


def flat_schema(values: dict) -> dict:
  """A config as moejax saved it before these sections: the moved keys flat in
  model.moe at `values` ({flat key: value})."""
  saved = base_config().to_dict()
  moe = saved["model"]["moe"]
  for section in {section for section, _, _ in MOVED.values()}:
    del moe[section]
  moe.update(values)
  return saved


def test_the_table_is_every_moved_key():
  sections = {section for section, _, _ in MOVED.values()}
  legacy = {old for p in parts_with_settings() if p.path in sections for old, _ in p.legacy_keys}
  assert legacy == set(MOVED)


def test_a_checkpoint_config_with_every_flat_key_loads_into_the_sections():
  saved = flat_schema({old: value for old, (_, _, value) in MOVED.items()})
  current = base_config()
  for section, key, value in MOVED.values():
    current.model.moe[section][key] = value
  upgraded = with_defaults(saved)
  assert upgraded == current.to_dict()
  assert config_mismatch(upgraded["model"], current.to_dict()["model"]) == []


def test_an_exported_workdir_model_with_flat_keys_reads_the_same_model():
  for old, (section, key, value) in MOVED.items():
    m = model_config_from_dict(flat_schema({old: value})["model"])
    assert m.moe[section][key] == value and old not in m.moe, old


def test_each_flat_key_in_a_live_config_is_refused_in_one_line_naming_its_section():
  for old, (section, key, value) in MOVED.items():
    c = base_config()
    c.model.moe[old] = value  # a config file setting the old key
    with pytest.raises(ConfigError) as error:
      validate_config(c)
    message = str(error.value)
    assert f"model.moe.{old}=" in message and f"model.moe.{section}.{key}" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=rf"use model\.moe\.{section}\.{key}$"):
      apply_overrides(base_config(), [f"model.moe.{old}={value}"])  # a sweep override
