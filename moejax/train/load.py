"""The one loader: a model for inference or fine-tuning from any source, a
converted workdir, a training workdir (its latest checkpoint) or an HF
checkpoint directory. Each gives a Loaded (config in the one model schema,
params, rest) of the one Decoder. It sits in train, above interop's converters and
the checkpoint reader (restore.py)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError
from moejax.interop.convert import Loaded, import_hf, is_converted_workdir, load_workdir
from moejax.models.decoder import unstack_layers
from moejax.train.restore import restore


class HFTokenizer:
  """tokenizer.json through the `tokenizers` package (installed with transformers)."""

  def __init__(self, path: str):
    try:
      from tokenizers import Tokenizer
    except ImportError as e:
      raise ConfigError(
        f"{path} needs the `tokenizers` package; install it or pass --prompt_ids"
      ) from e
    self._tokenizer = Tokenizer.from_file(path)

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tokenizer.encode(text).ids, np.int32)

  def decode(self, ids) -> str:
    return self._tokenizer.decode([int(i) for i in ids])


def hf_tokenizer(directory: str):
  """The directory's tokenizer.json as a tokenizer, or None when it has none."""
  path = os.path.join(directory, "tokenizer.json")
  return HFTokenizer(path) if os.path.exists(path) else None


def eos_token_id(hf_config: dict | None, directory: str | None) -> int | None:
  """The first eos id of generation_config.json or config.json, if any."""
  sources = [hf_config or {}]
  if directory and os.path.exists(os.path.join(directory, "generation_config.json")):
    with open(os.path.join(directory, "generation_config.json")) as f:
      sources.insert(0, json.load(f))
  for source in sources:
    eos = source.get("eos_token_id")
    if eos is not None:
      return eos[0] if isinstance(eos, list) else int(eos)
  return None


def load_model(workdir: str | None = None, hf_dir: str | None = None):
  """(Loaded, tokenizer or None, eos id or None) from exactly one of the two sources."""
  if (workdir is None) == (hf_dir is None):
    raise ConfigError("give exactly one of --workdir and --hf_dir")
  if hf_dir is not None:
    loaded = import_hf(hf_dir)
    return loaded, hf_tokenizer(hf_dir), eos_token_id(loaded.hf_config, hf_dir)
  assert workdir is not None  # exactly one of the two, checked above
  if is_converted_workdir(workdir):
    directory = os.path.join(workdir, "model")
    loaded = load_workdir(workdir)
    return loaded, hf_tokenizer(directory), eos_token_id(loaded.hf_config, directory)
  if os.path.isdir(os.path.join(workdir, "checkpoints")):
    loaded, tokenizer = from_training_workdir(workdir)
    return loaded, tokenizer, None
  raise ConfigError(
    f"{workdir} holds neither a converted model (model/config.json) nor "
    "training checkpoints (checkpoints/)"
  )


def from_training_workdir(workdir: str, step: int | None = None):
  """(Loaded, tokenizer) of a training workdir's checkpoint (latest by default), read
  by the one checkpoint reader (moejax.train.restore.restore)."""
  r = restore(workdir, step, for_generation=True)
  params, rest = (jax.tree.map(jnp.asarray, tree) for tree in (r.params, r.rest))
  return Loaded(*unstack_layers(r.config.model, params, rest)), r.tokenizer
