"""Streaming safetensors I/O: read one tensor at a time, write shard by shard.

Reader: a directory with `model.safetensors.index.json` (sharded) or one
`model.safetensors`. Files are opened with `safe_open` (memory-mapped) and a
tensor is read only when asked for, so importing a checkpoint larger than RAM
holds the result and one tensor, never a second copy of the checkpoint.

Writer: tensors are buffered up to `max_shard_bytes` and each full buffer is
written as one shard; at close the shards get HF's names
(model-0000i-of-0000N.safetensors) and the index file is written.
"""
import json
import os

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from moejax.errors import ConfigError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# What moejax parameters can hold (cast to the parameter dtype on import).
READABLE_DTYPES = ("F64", "F32", "F16", "BF16")


def read_json(path: str) -> dict:
  """A JSON object from `path`; ConfigError naming the file if missing, empty or invalid."""
  if not os.path.isfile(path):
    raise ConfigError(f"file is missing ({path})")
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConfigError(f"not valid JSON: {e} ({path})") from e
  if not isinstance(data, dict):
    raise ConfigError(f"expected a JSON object, found {type(data).__name__} ({path})")
  return data


def open_safetensors(path: str):
  """safe_open(path); ConfigError naming the file if it is empty, truncated or not safetensors."""
  try:
    return safe_open(path, "numpy")
  except Exception as e:  # noqa: BLE001 - safetensors raises SafetensorError and OSError
    raise ConfigError(f"not a readable safetensors file: {e} ({path})") from e


class SafetensorsReader:

  def __init__(self, directory: str, index_file: str = INDEX_FILE,
               single_file: str = SINGLE_FILE):
    self.directory = directory
    index_path = os.path.join(directory, index_file)
    if os.path.exists(index_path):
      weight_map = read_json(index_path).get("weight_map")
      if not isinstance(weight_map, dict):
        raise ConfigError(f"no weight_map object ({index_path})")
      self.file_of = dict(weight_map)
    elif os.path.exists(os.path.join(directory, single_file)):
      with open_safetensors(os.path.join(directory, single_file)) as f:
        self.file_of = {name: single_file for name in f.keys()}
    else:
      raise ConfigError(f"{directory} has neither {index_file} nor {single_file}")
    self._open = {}

  def __contains__(self, name: str) -> bool:
    return name in self.file_of

  def names(self) -> list[str]:
    return list(self.file_of)

  def _handle(self, name: str):
    if name not in self.file_of:
      raise ConfigError(f"tensor {name!r} is missing from {self.directory}")
    file = self.file_of[name]
    if file not in self._open:
      path = os.path.join(self.directory, file)
      if not os.path.exists(path):
        raise ConfigError(f"tensor {name!r}: its file {file} (named by the index) is missing "
                          f"from {self.directory}")
      self._open[file] = open_safetensors(path)
    return self._open[file]

  def _path(self, name: str) -> str:
    return os.path.join(self.directory, self.file_of[name])

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._handle(name).get_slice(name).get_shape())

  def read(self, name: str, expected_shape: tuple[int, ...], dtype) -> np.ndarray:
    """The tensor as `dtype`, after checking its stored dtype and its shape."""
    handle = self._handle(name)
    view = handle.get_slice(name)
    stored = view.get_dtype()
    if stored not in READABLE_DTYPES:
      raise ConfigError(
          f"tensor {name!r} is stored as {stored}; moejax parameters hold "
          f"{', '.join(READABLE_DTYPES)}. Dequantize the checkpoint first (e.g. FP8 "
          f"weights with their weight_scale_inv) and convert that ({self._path(name)})")
    shape = tuple(view.get_shape())
    if shape != tuple(expected_shape):
      raise ConfigError(f"tensor {name!r} has shape {shape}; the config expects "
                        f"{tuple(expected_shape)} ({self._path(name)})")
    try:
      array = handle.get_tensor(name)
    except Exception as e:  # noqa: BLE001 - a truncated file fails only here
      raise ConfigError(f"tensor {name!r} cannot be read: {e} "
                        f"({self._path(name)})") from e
    return array.astype(dtype, copy=False)


class ShardedWriter:

  def __init__(self, directory: str, max_shard_bytes: int = 2 << 30,
               prefix: str = "model", index_file: str = INDEX_FILE):
    os.makedirs(directory, exist_ok=True)
    self.directory, self.max_shard_bytes = directory, max_shard_bytes
    self.prefix, self.index_file = prefix, index_file
    self._buffer, self._buffer_bytes, self._shards, self._total = {}, 0, [], 0
    self.file_of: dict[str, str] = {}

  def add(self, name: str, array: np.ndarray) -> None:
    if name in self.file_of or name in self._buffer:
      raise ValueError(f"tensor {name!r} written twice")
    array = np.ascontiguousarray(array)
    if self._buffer and self._buffer_bytes + array.nbytes > self.max_shard_bytes:
      self._flush()
    self._buffer[name] = array
    self._buffer_bytes += array.nbytes
    self._total += array.nbytes

  def _flush(self) -> None:
    temp = f"{self.prefix}.part{len(self._shards)}.tmp"
    save_file(self._buffer, os.path.join(self.directory, temp), metadata={"format": "pt"})
    self._shards.append((temp, list(self._buffer)))
    self._buffer, self._buffer_bytes = {}, 0

  def close(self) -> None:
    if self._buffer or not self._shards:
      self._flush()
    count = len(self._shards)
    for i, (temp, names) in enumerate(self._shards):
      final = f"{self.prefix}-{i + 1:05d}-of-{count:05d}.safetensors"
      os.replace(os.path.join(self.directory, temp), os.path.join(self.directory, final))
      self.file_of.update({name: final for name in names})
    index = {"metadata": {"total_size": self._total}, "weight_map": dict(sorted(
        self.file_of.items()))}
    with open(os.path.join(self.directory, self.index_file), "w") as f:
      json.dump(index, f, indent=2)
