"""Restore a trained model (and its tokenizer) from a training workdir."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from moejax.data import get_tokenizer
from moejax.data.pipeline import build_lm_data
from moejax.errors import ConfigError
from moejax.train.checkpoint import Checkpointer
from moejax.train.loop import init_state


def load_from_workdir(workdir: str, step: int | None = None, *, for_generation=False):
  """(config, graphdef, params, rest, tokenizer) of the checkpoint at `step` (latest by default).

  for_generation: capacity dispatch is replaced by dropless, because capacity
  drops depend on the other tokens in the batch and would make decoding
  non-causal; the parameters are the same.
  """
  ckpt = Checkpointer(workdir, read_only=True)
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
  state, _ = ckpt.restore(step, jax.tree.map(np.asarray, state))
  state = jax.tree.map(jnp.asarray, state)
  ckpt.close()
  if config.data.tokenizer == "byte":
    tokenizer = get_tokenizer("byte")
  else:  # learned tokenizers live beside the data; the pipeline finds them
    tokenizer = build_lm_data(config.data, seed=config.seed).tokenizer
  return config, graphdef, state.params, state.rest, tokenizer
