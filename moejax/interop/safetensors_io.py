"""Streaming safetensors I/O: read one tensor at a time, write shard by shard.

Reader: a directory with `model.safetensors.index.json` (sharded) or one
`model.safetensors`. Files are opened with `safe_open` (header, dtypes and
shapes checked) and a tensor's bytes are read only when asked for, with
pread at the offsets of the file's header: no page of the checkpoint is mapped
into the process, so importing a checkpoint larger than RAM holds the result
and one tensor, never a second copy (a memory map's pages would count as
resident until the file is closed). `read_part` reads one row of axis 0 (one
expert of a stacked array).

Writer: tensors are buffered up to `max_shard_bytes` and each full buffer is
written as one shard; at close the shards get HF's names
(model-0000i-of-0000N.safetensors) and the index file is written.
PlannedWriter: every tensor's name, shape and dtype given up front, so each
shard's header is written first and each tensor (or one row of axis 0 of it)
goes straight to its offset: nothing is buffered, tensors arrive in any order.
"""

import json
import math
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from moejax.errors import ConfigError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# What moejax parameters can hold (cast to the parameter dtype on import).
READABLE_DTYPES = ("F64", "F32", "F16", "BF16")
NUMPY_DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
}
SAFETENSORS_DTYPES = {v: k for k, v in NUMPY_DTYPES.items()}
WRITE_CHUNK_BYTES = 16 << 20


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


def read_header(path: str) -> tuple[int, dict]:
  """(offset of the data, {name: (dtype, shape, begin, end)}) of a safetensors file."""
  with open(path, "rb") as f:
    raw = f.read(8)
    size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
    header = f.read(size) if 0 < size < 1 << 30 else b""
  if len(header) != size or size <= 0:
    raise ConfigError(f"not a readable safetensors file: bad header ({path})")
  try:
    entries = json.loads(header)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConfigError(f"not a readable safetensors file: {e} ({path})") from e
  return 8 + size, {
    name: (e["dtype"], tuple(e["shape"]), *e["data_offsets"])
    for name, e in entries.items()
    if name != "__metadata__"
  }


def pread_into(fd: int, out: np.ndarray, offset: int) -> int:
  """Fill the contiguous array `out` with the file's bytes from `offset`; bytes read."""
  flat = out.reshape(-1).view(np.uint8)
  view, done = memoryview(flat), 0  # type: ignore[arg-type]  # numpy stub: __buffer__ 3.12+
  while done < len(view):
    n = os.preadv(fd, [view[done:]], offset + done)
    if n <= 0:
      break
    done += n
  return done


class SafetensorsReader:
  def __init__(self, directory: str, index_file: str = INDEX_FILE, single_file: str = SINGLE_FILE):
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
    self._open: dict[str, Any] = {}  # file -> an open safetensors handle
    self._headers: dict[str, tuple[int, dict]] = {}  # file -> (data start, entries)
    self._fds: dict[str, int] = {}

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
        raise ConfigError(
          f"tensor {name!r}: its file {file} (named by the index) is missing from {self.directory}"
        )
      self._open[file] = open_safetensors(path)
    return self._open[file]

  def _path(self, name: str) -> str:
    return os.path.join(self.directory, self.file_of[name])

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._handle(name).get_slice(name).get_shape())

  def _checked_shape(self, name: str, expected_shape) -> tuple[int, ...]:
    """The tensor's shape, after checking its stored dtype and that shape."""
    view = self._handle(name).get_slice(name)
    stored = view.get_dtype()
    if stored not in READABLE_DTYPES:
      raise ConfigError(
        f"tensor {name!r} is stored as {stored}; moejax parameters hold "
        f"{', '.join(READABLE_DTYPES)}. Dequantize the checkpoint first (e.g. FP8 "
        f"weights with their weight_scale_inv) and convert that ({self._path(name)})"
      )
    shape = tuple(view.get_shape())
    if shape != tuple(expected_shape):
      raise ConfigError(
        f"tensor {name!r} has shape {shape}; the config expects "
        f"{tuple(expected_shape)} ({self._path(name)})"
      )
    return shape

  def read(self, name: str, expected_shape: tuple[int, ...], dtype) -> np.ndarray:
    """The tensor as `dtype`, after checking its stored dtype and its shape."""
    shape = self._checked_shape(name, expected_shape)
    return self._pread(name, shape, 0, math.prod(shape)).astype(dtype, copy=False)

  def read_part(self, name: str, index: int, expected_shape: tuple[int, ...], dtype):
    """Row `index` of axis 0 of the tensor (e.g. one expert of a stacked array) as
    `dtype`, after the checks of `read` on the whole tensor."""
    shape = self._checked_shape(name, expected_shape)
    if not 0 <= index < shape[0]:
      raise IndexError(f"row {index} of {name!r} (shape {shape})")
    row = math.prod(shape[1:])
    return self._pread(name, shape[1:], index * row, row).astype(dtype, copy=False)

  def dtype(self, name: str) -> np.dtype | None:
    """The stored dtype as numpy's (None for one numpy cannot hold)."""
    return NUMPY_DTYPES.get(self._handle(name).get_slice(name).get_dtype())

  def _pread(self, name: str, shape: tuple, start: int, count: int) -> np.ndarray:
    """`count` elements from element `start` of the tensor, as its stored dtype."""
    file = self.file_of[name]
    if file not in self._headers:
      path = self._path(name)
      self._headers[file] = read_header(path)
      self._fds[file] = os.open(path, os.O_RDONLY)
    data_start, entries = self._headers[file]
    stored, _, begin, end = entries[name]
    out = np.empty(shape, NUMPY_DTYPES[stored])
    offset = data_start + begin + start * out.itemsize
    if (end - begin) // out.itemsize < start + count or pread_into(
      self._fds[file], out, offset
    ) != out.nbytes:
      raise ConfigError(
        f"tensor {name!r} cannot be read: the file ends before its data ({self._path(name)})"
      )
    return out

  def close(self) -> None:
    for fd in getattr(self, "_fds", {}).values():
      os.close(fd)
    self._fds, self._headers, self._open = {}, {}, {}

  def __del__(self):
    self.close()


class ShardedWriter:
  def __init__(
    self,
    directory: str,
    max_shard_bytes: int = 2 << 30,
    prefix: str = "model",
    index_file: str = INDEX_FILE,
  ):
    os.makedirs(directory, exist_ok=True)
    self.directory, self.max_shard_bytes = directory, max_shard_bytes
    self.prefix, self.index_file = prefix, index_file
    self._buffer: dict[str, np.ndarray] = {}
    self._shards: list[tuple[str, list[str]]] = []  # (temporary file, tensor names)
    self._buffer_bytes, self._total = 0, 0
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
    index = {
      "metadata": {"total_size": self._total},
      "weight_map": dict(sorted(self.file_of.items())),
    }
    with open(os.path.join(self.directory, self.index_file), "w") as f:
      json.dump(index, f, indent=2)


class PlannedWriter:
  """Shards planned from (name, shape, dtype) in order, as ShardedWriter would fill
  them (a new shard when the next tensor would pass max_shard_bytes); each header
  is written at once and every tensor goes to its offset: `write` a whole tensor,
  `write_part` one row of its axis 0, in any order. `close` checks every byte was
  written, renames the shards to their final names and writes the index."""

  def __init__(
    self,
    directory: str,
    specs,
    max_shard_bytes: int = 2 << 30,
    prefix: str = "model",
    index_file: str = INDEX_FILE,
  ):
    os.makedirs(directory, exist_ok=True)
    self.directory, self.index_file = directory, index_file
    shards: list[list[tuple[str, tuple[int, ...], np.dtype, int]]] = [[]]
    size = 0
    for name, shape, dtype in specs:
      nbytes = math.prod(shape) * np.dtype(dtype).itemsize
      if shards[-1] and size + nbytes > max_shard_bytes:
        shards.append([])
        size = 0
      shards[-1].append((name, tuple(shape), np.dtype(dtype), nbytes))
      size += nbytes
    self._where: dict[str, tuple[int, int, tuple[int, ...], np.dtype]] = {}
    self._todo: dict[str, int] = {}
    self._files: list[tuple[int, str, str, int]] = []  # (fd, temporary, final, data start)
    self._total = 0
    for i, shard in enumerate(shards):
      final = f"{prefix}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
      offset = 0
      for name, shape, dtype, nbytes in shard:
        if name in self._where:
          raise ValueError(f"tensor {name!r} planned twice")
        header[name] = {
          "dtype": SAFETENSORS_DTYPES[dtype],
          "shape": list(shape),
          "data_offsets": [offset, offset + nbytes],
        }
        self._where[name] = (i, offset, shape, dtype)
        self._todo[name] = nbytes
        offset += nbytes
      raw = json.dumps(header, separators=(",", ":")).encode()
      raw += b" " * (-len(raw) % 8)
      temp = os.path.join(directory, final + ".tmp")
      fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
      os.write(fd, struct.pack("<Q", len(raw)) + raw)
      os.ftruncate(fd, 8 + len(raw) + offset)
      self._files.append((fd, temp, final, 8 + len(raw)))
      self._total += offset

  def write(self, name: str, array: np.ndarray) -> None:
    _, _, shape, dtype = self._where[name]
    self._put(name, array, shape, 0)

  def write_part(self, name: str, index: int, array: np.ndarray) -> None:
    """Row `index` of axis 0 of tensor `name` (e.g. expert `index` of a stacked array)."""
    _, _, shape, dtype = self._where[name]
    if not 0 <= index < shape[0]:
      raise IndexError(f"row {index} of {name!r} (shape {shape})")
    self._put(name, array, shape[1:], index * math.prod(shape[1:]) * dtype.itemsize)

  def _put(self, name, array, shape, start) -> None:
    file, offset, _, dtype = self._where[name]
    if tuple(array.shape) != tuple(shape) or array.dtype != dtype:
      raise ValueError(
        f"tensor {name!r}: got {array.dtype}{list(array.shape)}, planned {dtype}{list(shape)}"
      )
    fd, _, _, data_start = self._files[file]
    at = data_start + offset + start
    # A few MB of rows at a time: a transposed view is copied in pieces, never whole.
    rows = array.reshape(-1) if array.ndim < 2 else array
    step = max(1, WRITE_CHUNK_BYTES // max(1, rows[:1].nbytes))
    for i in range(0, len(rows), step):
      chunk = np.ascontiguousarray(rows[i : i + step]).reshape(-1).view(np.uint8)
      view = memoryview(chunk)  # type: ignore[arg-type]  # numpy stub: __buffer__ 3.12+
      done = 0
      while done < len(view):
        done += os.pwrite(fd, view[done:], at + done)
      at += len(view)
      self._todo[name] -= len(view)

  def close(self) -> None:
    missing = [name for name, left in self._todo.items() if left]
    if missing:
      raise ValueError(f"{len(missing)} planned tensors not (fully) written, e.g. {missing[0]!r}")
    file_of = {}
    for i, (fd, temp, final, _) in enumerate(self._files):
      os.close(fd)
      os.replace(temp, os.path.join(self.directory, final))
    for name, (i, _, _, _) in self._where.items():
      file_of[name] = self._files[i][2]
    index = {"metadata": {"total_size": self._total}, "weight_map": dict(sorted(file_of.items()))}
    with open(os.path.join(self.directory, self.index_file), "w") as f:
      json.dump(index, f, indent=2)
