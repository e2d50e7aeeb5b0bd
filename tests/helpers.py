"""Small builders shared by tests (configs, random routing inputs, a step-0 training
workdir). Test modules import from here, never from one another or a conftest."""

import re
import zlib

import ml_collections
import pytest
import numpy as np

from moejax.config import base_config
from moejax.migrate import OPEN_DICTS

# Steps of tests/conftest.py's `tiny_workdir` (the tiny MoE LM, checkpointed at the last).
TINY_WORKDIR_STEPS = 4


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


def host(tree):
  """`tree` (params, rest) with numpy leaves (read-only views of jax's arrays) in new
  containers: a test may replace leaves of it without touching a shared fixture."""
  import jax

  return jax.tree.map(np.asarray, tree)


def training_workdir(workdir: str, config=None) -> None:
  """Step 0 of `config` (default: the tiny default MoE), as experiments.train
  checkpoints it."""
  import jax

  from moejax.configs.lm_shakespeare_moe import get_config
  from moejax.train.checkpoint import Checkpointer, jsonable
  from moejax.train.loop import init_state

  config = config or get_config("size=tiny")
  _, state, _ = init_state(config)
  ckpt = Checkpointer(workdir, max_to_keep=1)
  ckpt.save(0, jax.tree.map(np.asarray, state), {}, {"config": jsonable(config.to_dict())})
  ckpt.close()


def integration_share(value: str) -> tuple[int, int] | None:
  """(K, N) from "K/N", (0, 1) from "all", None from "none"; pytest.UsageError else."""
  if value == "all":
    return 0, 1
  if value == "none":
    return None
  k, _, n = value.partition("/")
  if k.isdigit() and n.isdigit() and int(k) < int(n):
    return int(k), int(n)
  raise pytest.UsageError(
    f"--integration-share: expected K/N with 0 <= K < N, 'all' or 'none', got {value!r}"
  )


def in_share(nodeid: str, share: tuple[int, int] | None) -> bool:
  """Whether the integration test `nodeid` belongs to `share` (see integration_share)."""
  if share is None:
    return False
  k, n = share
  return zlib.crc32(nodeid.encode()) % n == k


def documented_split_sha256(doc: str) -> dict[str, str]:
  """{split: sha256} of the '  <split>  <64 hex digits>' lines of a builder's docstring."""
  return dict(re.findall(r"^ +(\w+) +([0-9a-f]{64})$", doc, flags=re.M))
