"""Small builders shared by tests (configs, random routing inputs)."""

import ml_collections
import numpy as np

from moejax.config import base_config
from moejax.migrate import OPEN_DICTS


def moe_cfg(**overrides) -> ml_collections.FrozenConfigDict:
  """The default MoE layer config with overrides, frozen as layers hold it. A dict
  for a part's section (probmoe={"k_min": 1}) changes only the keys it names."""
  c = base_config().model.moe
  for key, value in overrides.items():
    if (
      isinstance(value, dict)
      and key not in OPEN_DICTS
      and isinstance(c.get(key), ml_collections.ConfigDict)
    ):
      c[key].update(value)
    else:
      c[key] = value
  return ml_collections.FrozenConfigDict(c)


def random_logits(seed: int, num_tokens: int, num_experts: int, scale=2.0):
  """Float32 logits without ties (ties make top-k ambiguous for oracles)."""
  rng = np.random.default_rng(seed)
  return (scale * rng.standard_normal((num_tokens, num_experts))).astype(np.float32)


def set_key(config, dotted_key: str, value) -> None:
  """config['a']['b']['c'] = value for dotted_key 'a.b.c', with no type conversion
  (bad-input tests set values the schema would refuse)."""
  section, _, name = dotted_key.rpartition(".")
  node = config
  for part in filter(None, section.split(".")):
    node = node[part]
  node[name] = value
