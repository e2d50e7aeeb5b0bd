"""A config's model and the fresh TrainState of a run: what the loop starts from
and what the checkpoint reader (restore.py) restores into."""

import ml_collections
import numpy as np
from flax import nnx

from moejax import models
from moejax.data.l3_allocation import l3_rows
from moejax.train import optimizer as optimizer_lib
from moejax.train import step as step_lib


def build_model(config):
  """The model `config.model_name` (moejax.models.MODELS) of `config.model`, its
  parameters stored in train.param_dtype (router ones float32)."""
  model_cfg = ml_collections.FrozenConfigDict(config.model)
  rows = l3_rows(config)  # L3 tables' rows per token id, counted on data
  inputs = {} if rows is None else {"l3_rows": rows}
  model = models.build_model(config.model_name, model_cfg, rngs=nnx.Rngs(config.seed), **inputs)
  return optimizer_lib.apply_param_dtype(model, config.train.get("param_dtype", "float32"))


def init_state(config):
  """(graphdef, TrainState, optimizer) for a fresh run."""
  graphdef, params, rest = step_lib.split_model(build_model(config))
  optimizer = optimizer_lib.make_optimizer(config.train)
  state = step_lib.TrainState(np.int32(0), params, rest, optimizer.init(params))
  return graphdef, state, optimizer
