"""Fine-tuning a pretrained model: `--config.init.hf_dir=DIR` (HF safetensors or
a converted workdir, experiments.convert); `--config.init.upcycle_from=DIR`
starts an MoE from a dense training workdir instead (moejax/train/upcycle.py).

`resolve_config` replaces the config's `model` section with the one the
directory holds (its sizes, attention, routing and expert counts), keeping
the config's MoE *training* keys (router losses, jitter, the aux-loss-free
bias rate, dispatch and kernel choices) and compute dtype. The config must
name the directory's family in `model.family`, so a config meant for one
family never silently trains another. It reads config.json only, so a bad
directory is refused before anything is built or written.

`initial_state` then puts the pretrained params (and router state, e.g.
DeepSeek-V3's score-correction bias) into a fresh TrainState: step 0, a
fresh optimizer, in the run's shardings when there is a mesh. Resuming a
run restores the checkpoint, never the directory's weights; it reads the
directory's config.json again, to check the run still matches it.
"""

import os

import jax
import ml_collections
import numpy as np

from moejax.adapters.projection import (
  carry_adapter,
  check_adapted_ffn,
  with_adapter_params,
  without_adapter,
)
from moejax.errors import ConfigError
from moejax.interop.convert import (
  WORKDIR_MODEL,
  check_shapes,
  import_hf,
  is_converted_workdir,
  load_workdir,
  read_config_json,
)
from moejax.interop.hf_config import from_hf_config
from moejax.interop.safetensors_io import read_json
from moejax.migrate import model_config_from_dict
from moejax.models.structure import moe_layer_indices
from moejax.train import step as step_lib
from moejax.train import upcycle

# model.moe keys that say how to train, not what the pretrained model computes.
TRAINING_MOE_KEYS = (
  "loss_weights",
  "routing.jitter",
  "routing.bias_update_rate",
  "dispatch",
  "grouped_matmul",
  "dropless",  # the dispatchers' and grouped matmuls' own settings
  "capacity",
  "gmm",
  "losses",  # the router losses' own settings (model.moe.losses.<name>)
)


def source_model_config(directory: str) -> ml_collections.ConfigDict:
  """The model config stored in `directory` (a converted workdir or an HF dir), read
  without its weights."""
  if is_converted_workdir(directory):
    return model_config_from_dict(
      read_json(os.path.join(directory, WORKDIR_MODEL, "config.json"))["model"]
    )
  return from_hf_config(read_config_json(directory))


def check_one_source(config) -> None:
  """At most one of init.hf_dir and init.upcycle_from."""
  if config.init.hf_dir and config.init.get("upcycle_from"):
    raise ConfigError(
      f"init.upcycle_from={config.init.upcycle_from} and "
      f"init.hf_dir={config.init.hf_dir} are both set; give one"
    )


def check_sources(config) -> None:
  """At most one of init.hf_dir and init.upcycle_from, and the upcycling source
  checked against the config (upcycle.source_config), before anything is built."""
  check_one_source(config)
  if config.init.upcycle_from:
    upcycle.source_config(config)


def resolve_config(config) -> ml_collections.ConfigDict:
  """`config` with its model section taken from init.hf_dir (unchanged without one)."""
  check_one_source(config)
  directory = config.init.hf_dir
  if not directory:
    return config
  try:
    source = source_model_config(directory)
  except ConfigError as e:
    raise ConfigError(f"{e} (init.hf_dir={directory})") from e
  if config.model.family != source.family:
    raise ConfigError(
      f"init.hf_dir={directory} holds a {source.family} model, but the config "
      f"says model.family={config.model.family!r}; set "
      f"--config.model.family={source.family} or use that family's config"
    )
  out = ml_collections.ConfigDict(config.to_dict())
  for key in TRAINING_MOE_KEYS:
    section, _, name = key.rpartition(".")
    (source.moe[section] if section else source.moe)[name] = config.model.moe[key]
  source.dtype = config.model.dtype
  carry_adapter(source, config.model)  # an attention adapter to train on it
  check_adapted_ffn(source, source.num_layers - len(moe_layer_indices(source)))
  out.model = source
  return out


def pretrained(config):
  """(params, rest) of init.hf_dir, checked against the config's model."""
  directory = config.init.hf_dir
  loaded = load_workdir(directory) if is_converted_workdir(directory) else import_hf(directory)
  check_shapes(without_adapter(config.model), loaded.params, loaded.rest)
  return loaded.params, loaded.rest


def initial_state(config, state: step_lib.TrainState, optimizer, placement=None):
  """A fresh TrainState holding the pretrained weights, in `state`'s dtypes and
  (with a Placement) its shardings."""
  if config.init.upcycle_from:
    params, rest = upcycle.upcycled(
      config, jax.device_get(state.params), jax.device_get(state.rest)
    )
  else:
    params, rest = pretrained(config)
    params = with_adapter_params(params, state.params)  # the adapter starts fresh
  params, rest = jax.tree.map(
    lambda x, s: np.asarray(x).astype(s.dtype), (params, rest), (state.params, state.rest)
  )

  def fresh(p, r):
    return step_lib.TrainState(np.int32(0), p, r, optimizer.init(p))

  if placement is None:
    return jax.jit(fresh)(params, rest)
  return jax.jit(fresh, out_shardings=placement.state)(params, rest)
