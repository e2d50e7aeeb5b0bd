"""Checkpoints written before a config section existed still restore and compare equal."""
from moejax.config import base_config, with_defaults
from moejax.train.checkpoint import config_mismatch


def old_schema(config: dict) -> dict:
  """The dict an older moejax saved: without the `model.l3` section and a moe key."""
  saved = {**config, "model": {k: v for k, v in config["model"].items() if k != "l3"}}
  saved["model"]["moe"] = {k: v for k, v in config["model"]["moe"].items()
                           if k != "sere_rho"}
  saved["model"]["moe"]["loss_weights"] = {"z_loss": 1e-3}
  return saved


def test_missing_keys_get_defaults_and_open_dicts_are_kept_whole():
  current = base_config()
  current.model.moe.loss_weights = {"z_loss": 1e-3}
  upgraded = with_defaults(old_schema(current.to_dict()))
  assert upgraded["model"]["l3"] == base_config().model.l3.to_dict()
  assert upgraded["model"]["moe"]["sere_rho"] == base_config().model.moe.sere_rho
  # loss_weights is data: the saved dict is not merged with the default one.
  assert upgraded["model"]["moe"]["loss_weights"] == {"z_loss": 1e-3}
  assert config_mismatch(upgraded["model"], current.to_dict()["model"]) == []
  # A value the old run did set still counts.
  changed = old_schema(current.to_dict())
  changed["model"]["moe"]["top_k"] = 3
  diffs = config_mismatch(with_defaults(changed)["model"], current.to_dict()["model"])
  assert len(diffs) == 1 and diffs[0].startswith("moe.top_k")
