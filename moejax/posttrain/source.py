"""The model a post-training tool starts from, read once: a training workdir (its
latest checkpoint, by moejax.train.restore.restore), a converted workdir or an HF
checkpoint directory (moejax.train.load.load_model).

A `Source` holds the model config (loop layout), host params and rest, the
tokenizer and its end-of-document id, and for a training workdir the run's config,
step and data-iterator state (what a written workdir needs to train on).
`save_training_workdir` writes a model back as a training workdir.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from moejax.errors import ConfigError

KINDS = ("training", "converted", "hf")


@dataclasses.dataclass
class Source:
  kind: str  # training | converted | hf
  where: str  # how the user named it, for messages ("--workdir=DIR")
  model: ml_collections.ConfigDict
  params: dict
  rest: dict
  config: ml_collections.ConfigDict | None = None  # the run's config (training)
  step: int | None = None
  data_state: Any = None
  hf_config: dict | None = None
  imported_tokenizer: Any = None  # converted / hf: tokenizer.json, if any
  imported_eos_id: int | None = None
  restored: Any = dataclasses.field(default=None, repr=False)  # train.restore.Restored

  @functools.cached_property
  def tokenizer(self):
    """The model's tokenizer (a training run's is built on first use)."""
    return self.restored.tokenizer if self.kind == "training" else self.imported_tokenizer

  def training_run(self) -> tuple[ml_collections.ConfigDict, int]:
    """(the run's config, the checkpoint's step) of a training workdir; ValueError
    for an imported model (converted, hf), which has neither."""
    if self.config is None or self.step is None:
      raise ValueError(f"{self.where}: a {self.kind} model has no training run")
    return self.config, self.step

  @property
  def eos_id(self) -> int | None:
    if self.kind == "training":
      return self.tokenizer.eos_id
    return self.imported_eos_id


def training_config(workdir: str, key: str = "--workdir"):
  """(config, step) of a training workdir's latest checkpoint: metadata only;
  ConfigError naming `key` when `workdir` holds no training run."""
  check_workdir(workdir, key, kinds=("training", "mixed"))
  from moejax.train.checkpoint import latest_config

  return latest_config(workdir)


def check_workdir(path: str, key: str, kinds=("training", "converted", "mixed")) -> str:
  """The kind of the workdir at `path`; ConfigError naming `key=path` unless it is one
  of `kinds` (moejax.cli_files.checked_workdir)."""
  from moejax import cli_files

  return cli_files.checked_workdir(key, path, kinds)


def load(workdir: str | None = None, hf_dir: str | None = None) -> Source:
  """The Source of exactly one of a workdir (a converted model, else its training
  checkpoints, as moejax.train.load.load_model reads it) and an HF directory."""
  from moejax.interop.convert import is_converted_workdir
  from moejax.train.load import load_model

  if (workdir is None) == (hf_dir is None):
    raise ConfigError("give exactly one of --workdir and --hf_dir")
  if (
    workdir is not None
    and not is_converted_workdir(workdir)
    and os.path.isdir(os.path.join(workdir, "checkpoints"))
  ):
    return load_training(workdir)
  loaded, tokenizer, eos_id = load_model(workdir, hf_dir)
  params, rest = jax.tree.map(np.asarray, (loaded.params, loaded.rest))
  kind, where = ("hf", f"--hf_dir={hf_dir}") if hf_dir else ("converted", f"--workdir={workdir}")
  return Source(
    kind,
    where,
    loaded.config,
    params,
    rest,
    hf_config=loaded.hf_config,
    imported_tokenizer=tokenizer,
    imported_eos_id=eos_id,
  )


def load_training(workdir: str, key: str = "--workdir", step: int | None = None) -> Source:
  """A training workdir's checkpoint of `step` (latest by default), data-iterator
  state included."""
  from moejax.train.restore import restore

  r = restore(workdir, step)
  return Source(
    "training",
    f"{key}={workdir}",
    r.config.model,
    r.params,
    r.rest,
    config=r.config,
    step=r.step,
    data_state=r.data_state,
    restored=r,
  )


def save_training_workdir(
  out: str, config, params: dict, rest: dict, step: int, data_state
) -> None:
  """A training workdir at `out` holding one checkpoint of the model of `config`
  (a fresh optimizer state for `params`, the source's data position):
  experiments.train continues it."""
  from moejax.train import optimizer as optimizer_lib
  from moejax.train import step as step_lib
  from moejax.train.checkpoint import Checkpointer, jsonable

  optimizer = optimizer_lib.make_optimizer(config.train)
  state = step_lib.TrainState(jnp.asarray(step, jnp.int32), params, rest, optimizer.init(params))
  os.makedirs(out, exist_ok=True)
  ckpt = Checkpointer(out, config.train.max_to_keep)
  ckpt.save(step, state, data_state, {"config": jsonable(config.to_dict())})
  ckpt.close()


def with_model(config, m) -> ml_collections.ConfigDict:
  """A copy of the run's `config` whose model is `m`."""
  out = ml_collections.ConfigDict(config.to_dict())
  out.model = m
  return out
