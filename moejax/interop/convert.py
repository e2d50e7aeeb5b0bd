"""Import an HF checkpoint directory into moejax params, and export them back.

    loaded = import_hf(hf_dir)                  # config.json + safetensors -> Loaded
    model = loaded.model()                      # a Decoder (moejax/models/decoder.py)
    export_hf(loaded.config, loaded.params, loaded.rest, out_dir, base_hf_config=loaded.hf_config)

Parameters live in the trees of `nnx.split(model, nnx.Param, ...)` as pure
dicts (train/step.py's split_model), experts stacked expert-major
(w_gate, w_up [E, d, f], w_down [E, f, d]). Import reads tensor by tensor
(safetensors_io.py); export writes per-expert tensors under the family's
names, shard by shard. The expert count of each MoE layer is taken from the
params on export, so a pruned model (fewer experts in some layer) writes
without touching its config; a family that holds one count for all layers
refuses unequal counts, naming them.

A converted workdir (save_workdir / load_workdir) holds model/config.json
(the decoder config and the original HF config), the params as moejax-named
safetensors, and the checkpoint's other files (tokenizer, generation config).
"""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax.adapters.projection import NO_ADAPTER, adapter_name
from moejax.errors import ConfigError
from moejax.interop import dense_experts
from moejax.interop.hf_config import from_hf_config, to_hf_config
from moejax.interop.names import tensor_maps
from moejax.interop.safetensors_io import SafetensorsReader, ShardedWriter, read_json
from moejax.models.structure import moe_layer_indices
from moejax.migrate import model_config_from_dict
from moejax.validation import validate_model
from moejax.models.decoder import Decoder, abstract_model

PARAM_DTYPES = {"float32": np.float32, "bfloat16": jnp.bfloat16, "float16": np.float16}
CHECKPOINT_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")
WORKDIR_MODEL = "model"


@dataclasses.dataclass
class Loaded:
  config: ml_collections.ConfigDict  # the model config (moejax/config.py `model`)
  params: dict
  rest: dict  # non-trained state (e.g. DeepSeek-V3's e_score_correction_bias)
  hf_config: dict | None = None  # the original config.json, when there was one
  unused: tuple = ()  # checkpoint tensors no parameter reads (e.g. DeepSeek's MTP layer)

  def model(self) -> Decoder:
    graphdef, _, _ = abstract_model(self.config)
    return nnx.merge(graphdef, self.params, self.rest)


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree, path, value):
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value


def _orient(array, transpose: bool):
  return array.T if transpose else array


def read_config_json(hf_dir: str) -> dict:
  if not os.path.isdir(hf_dir):
    raise ConfigError(f"HF checkpoint directory does not exist or is not a directory ({hf_dir})")
  path = os.path.join(hf_dir, "config.json")
  if not os.path.exists(path):
    raise ConfigError(f"{hf_dir} has no config.json: not an HF checkpoint directory")
  return read_json(path)


def import_hf(hf_dir: str, param_dtype: str = "float32") -> Loaded:
  """An HF directory (config.json + safetensors) as moejax config and params."""
  if param_dtype not in PARAM_DTYPES:
    raise ConfigError(f"param_dtype={param_dtype!r}; valid: {', '.join(PARAM_DTYPES)}")
  dtype = PARAM_DTYPES[param_dtype]
  hf = read_config_json(hf_dir)
  try:
    m = from_hf_config(hf)
  except (ConfigError, TypeError, ValueError, KeyError, AttributeError) as e:
    raise ConfigError(f"{e} ({os.path.join(hf_dir, 'config.json')})") from e
  _, params, rest = abstract_model(m)
  trees = {"params": params, "rest": rest}
  reader = SafetensorsReader(hf_dir)
  used: set[str] = set()
  for tm in tensor_maps(m):
    target = _get(trees[tm.collection], tm.path)
    hf_shape = tm.hf_shape(target.shape)
    if tm.stacked:
      array = np.empty(target.shape, dtype)
      for expert, name in enumerate(tm.hf_names):
        array[expert] = _orient(reader.read(name, hf_shape, dtype), tm.transpose)
    else:
      array = _orient(reader.read(tm.hf_names[0], hf_shape, dtype), tm.transpose)
    state_dtype = target.dtype if tm.collection == "rest" else dtype
    _set(trees[tm.collection], tm.path, jnp.asarray(array, state_dtype))
    used.update(tm.hf_names)
  return Loaded(m, params, rest, hf, tuple(sorted(set(reader.names()) - used)))


def config_for_params(m, params) -> ml_collections.ConfigDict:
  """m with each MoE layer's expert count read from its router kernel [d, E]."""
  m = ml_collections.ConfigDict(m.to_dict())
  counts = [
    int(params["blocks"][i]["ffn"]["router_kernel"].shape[-1])
    for i in moe_layer_indices(m)
    if m.ffn_type == "moe"
  ]
  m.moe.expert_counts = [] if len(set(counts)) <= 1 else counts
  if counts:
    m.moe.num_experts = max(counts)
  validate_model(m)
  return m


def check_shapes(m, params, rest) -> None:
  """ConfigError naming the first array whose shape the config does not give."""
  _, want_params, want_rest = abstract_model(m)
  for name, want, have in (("params", want_params, params), ("rest", want_rest, rest)):
    want_flat = dict(nnx.traversals.flatten_mapping(want))
    have_flat = dict(nnx.traversals.flatten_mapping(have))
    for path, spec in want_flat.items():
      if path not in have_flat:
        raise ConfigError(f"{name} {'/'.join(map(str, path))} is missing")
      if tuple(have_flat[path].shape) != tuple(spec.shape):
        raise ConfigError(
          f"{name} {'/'.join(map(str, path))} has shape "
          f"{tuple(have_flat[path].shape)}; the config expects {tuple(spec.shape)}"
        )


def export_hf(
  m,
  params,
  rest,
  out_dir: str,
  *,
  family: str | None = None,
  dtype: str | None = None,
  base_hf_config: dict | None = None,
  max_shard_bytes: int = 2 << 30,
  extra_files_from: str | None = None,
) -> dict:
  """Write params as an HF checkpoint of `family` (default m.family); returns config.json.

  dtype: 'float32' | 'bfloat16' | 'float16' (default: each array's own dtype).
  Compressed experts ('quantized', 'codebook', 'factorised') are written as the
  dense float weights they compute with, and the export's moejax_export.json
  says so (dense_experts.py; experiments.convert prints its note).
  """
  if dtype and dtype not in PARAM_DTYPES:
    raise ConfigError(f"dtype={dtype!r}; valid: {', '.join(PARAM_DTYPES)}")
  if adapter_name(m) != NO_ADAPTER:
    raise ConfigError(
      f"model.attention.adapter={adapter_name(m)!r}: an HF checkpoint has no place for an "
      "attention adapter's token-routed terms (keep the training workdir, or export the base)"
    )
  m, params, rest, experts_record = dense_experts.for_export(m, params, rest, dtype)
  m = config_for_params(m, params)
  check_shapes(m, params, rest)
  hf = to_hf_config(m, family, base_hf_config)
  m.family = hf["model_type"]
  cast = PARAM_DTYPES[dtype] if dtype else None
  trees = {"params": params, "rest": rest}
  writer = ShardedWriter(out_dir, max_shard_bytes)
  for tm in tensor_maps(m):
    array = np.asarray(jax.device_get(_get(trees[tm.collection], tm.path)))
    if cast is not None and tm.collection == "params":
      array = array.astype(cast)
    parts = list(array) if tm.stacked else [array]
    for name, part in zip(tm.hf_names, parts):
      writer.add(name, _orient(part, tm.transpose))
  writer.close()
  hf["dtype"] = dtype or str(np.asarray(params["embed"]).dtype)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
  if extra_files_from:
    copy_extra_files(extra_files_from, out_dir)
  if experts_record is not None:
    dense_experts.write_record(out_dir, experts_record)
  return hf


def copy_extra_files(src: str, dst: str) -> None:
  """Tokenizer and generation files: everything but the weights, index, config and
  an export's record (which describes that export only)."""
  for name in os.listdir(src):
    path = os.path.join(src, name)
    if (
      os.path.isfile(path)
      and name not in CHECKPOINT_FILES + (dense_experts.EXPORT_RECORD,)
      and not name.endswith((".safetensors", ".tmp"))
    ):
      shutil.copy2(path, os.path.join(dst, name))


def _flat_named(tree) -> dict:
  return {
    ".".join(map(str, path)): value for path, value in nnx.traversals.flatten_mapping(tree).items()
  }


def save_workdir(workdir: str, loaded: Loaded, extra_files_from: str | None = None) -> str:
  """Write a converted model to workdir/model/ (see module doc); returns that directory."""
  directory = os.path.join(workdir, WORKDIR_MODEL)
  m = config_for_params(loaded.config, loaded.params)
  writer = ShardedWriter(directory, prefix="params", index_file="params.index.json")
  for collection, tree in (("params", loaded.params), ("rest", loaded.rest)):
    for name, value in _flat_named(tree).items():
      writer.add(f"{collection}/{name}", np.asarray(jax.device_get(value)))
  writer.close()
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({"model": m.to_dict(), "hf_config": loaded.hf_config}, f, indent=2)
  if extra_files_from:
    copy_extra_files(extra_files_from, directory)
  return directory


def is_converted_workdir(workdir: str) -> bool:
  return os.path.exists(os.path.join(workdir, WORKDIR_MODEL, "config.json"))


def load_workdir(workdir: str) -> Loaded:
  directory = os.path.join(workdir, WORKDIR_MODEL)
  path = os.path.join(directory, "config.json")
  saved = read_json(path)
  if not isinstance(saved.get("model"), dict):
    raise ConfigError(f"no 'model' object: not a converted workdir's config ({path})")
  m = model_config_from_dict(saved["model"])  # also a workdir of an older moejax
  validate_model(m)
  _, params, rest = abstract_model(m)
  trees = {"params": params, "rest": rest}
  reader = SafetensorsReader(directory, index_file="params.index.json")
  for collection, tree in trees.items():
    for key, spec in nnx.traversals.flatten_mapping(tree).items():
      name = f"{collection}/{'.'.join(map(str, key))}"
      _set(tree, key, jnp.asarray(reader.read(name, spec.shape, spec.dtype)))
  return Loaded(m, params, rest, saved.get("hf_config"))
