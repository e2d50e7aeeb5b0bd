"""Checkpoints written before a config section existed still restore and compare equal."""

from moejax.config import base_config
from moejax.migrate import with_defaults
from moejax.train.checkpoint import config_mismatch


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
  from moejax.migrate import model_config_from_dict

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
