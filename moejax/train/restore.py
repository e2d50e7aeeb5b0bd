"""Restore a trained model (and its tokenizer) from a training workdir: the one
reader of training checkpoints that every tool builds on (`restore`)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from moejax.data import get_tokenizer
from moejax.data.pipeline import build_lm_data
from moejax.errors import ConfigError
from moejax.train.checkpoint import Checkpointer
from moejax.train.build import init_state


def load_tokenizer(config):
  """The tokenizer the run trained with: bytes, or the learned tokenizer that lives
  beside its data (the data pipeline finds it)."""
  if config.data.tokenizer == "byte":
    return get_tokenizer("byte")
  return build_lm_data(config.data, seed=config.seed).tokenizer


@dataclasses.dataclass
class Restored:
  """One checkpoint: the run's config, the model's graphdef, host (numpy) params
  and rest, the data-iterator state, the step; the tokenizer on first use."""

  config: ml_collections.ConfigDict
  graphdef: object
  params: dict
  rest: dict
  data_state: dict
  step: int

  @functools.cached_property
  def tokenizer(self):
    return load_tokenizer(self.config)


def restore(workdir: str, step: int | None = None, *, for_generation=False) -> Restored:
  """The checkpoint of `step` (latest by default), read once.

  for_generation: capacity dispatch is replaced by dropless, because capacity
  drops depend on the other tokens in the batch and would make decoding
  non-causal; the parameters are the same.
  """
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    steps = ckpt.all_steps()
    step = (steps[-1] if steps else None) if step is None else step
    if step is None:
      raise ConfigError(f"no checkpoint in {ckpt.directory}")
    if step not in steps:
      raise ConfigError(f"no checkpoint of step {step} in {ckpt.directory}; it holds {steps}")
    config = ml_collections.ConfigDict(ckpt.read_meta(step)["config"])
    if for_generation and config.model.moe.dispatch == "capacity":
      config.model.moe.dispatch = "dropless"
    graphdef, state, _ = init_state(config)
    state, data_state = ckpt.restore(step, jax.tree.map(np.asarray, state))
  finally:
    ckpt.close()
  params, rest = jax.tree.map(np.asarray, (state.params, state.rest))
  return Restored(config, graphdef, params, rest, data_state, step)


def load_from_workdir(workdir: str, step: int | None = None, *, for_generation=False):
  """(config, graphdef, params, rest, tokenizer) of the checkpoint at `step` (latest
  by default), params and rest as device arrays (`restore`)."""
  r = restore(workdir, step, for_generation=for_generation)
  params, rest = jax.tree.map(jnp.asarray, (r.params, r.rest))
  return r.config, r.graphdef, params, rest, r.tokenizer
