"""Where data lives on disk, and cross-process safe writes into it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator


def resolve_data_dir(data_dir: str | os.PathLike | None) -> str:
  """``data_dir``, else $TFDS_DATA_DIR, else ~/tensorflow_datasets (tfds's rule)."""
  chosen = data_dir or os.environ.get('TFDS_DATA_DIR') or '~/tensorflow_datasets'
  return os.path.abspath(os.path.expanduser(os.fspath(chosen)))


@contextlib.contextmanager
def exclusive_lock(lock_path: str) -> Iterator[None]:
  """Blocks until this process holds ``lock_path`` (flock), so that processes
  racing to prepare or train the same artefact do it once, one at a time."""
  os.makedirs(os.path.dirname(lock_path), exist_ok=True)
  with open(lock_path, 'w') as lock_file:
    fcntl.flock(lock_file, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock_file, fcntl.LOCK_UN)


def atomic_write_bytes(path: str, payload: bytes) -> None:
  """Writes to a temporary file beside ``path`` and renames it into place, so
  readers see either no file or the whole file."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False) as f:
    f.write(payload)
  os.replace(f.name, path)
