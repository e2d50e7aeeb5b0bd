"""Packing: documents -> one token stream -> fixed-length LM windows, no padding.

Each document's tokens are followed by the tokenizer's separator (``eos_id``)
and all documents are concatenated in order. The stream is then cut into
consecutive, non-overlapping windows of ``seq_len + 1`` tokens; window ``i``
is ``stream[i * (seq_len + 1) : (i + 1) * (seq_len + 1)]`` and gives
``inputs = window[:-1]``, ``targets = window[1:]``. The tail shorter than one
window is dropped. Windows may span document boundaries (the separator tells
the model where one ends).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def pack_documents(documents: Iterable[np.ndarray], separator_id: int) -> np.ndarray:
  """Concatenates token arrays, each followed by ``separator_id``, as int32."""
  separator = np.array([separator_id], dtype=np.int32)
  pieces = [piece for doc in documents for piece in (np.asarray(doc, np.int32), separator)]
  return np.concatenate(pieces) if pieces else np.zeros([0], np.int32)


class PackedWindows:
  """Random-access view of a token stream as LM examples (a grain data source).

  ``windows[i]`` is ``{'inputs': int32[seq_len], 'targets': int32[seq_len]}``.
  """

  def __init__(self, stream: np.ndarray, seq_len: int):
    self.seq_len = seq_len
    self.window_len = seq_len + 1
    num_windows = len(stream) // self.window_len
    self._windows = np.asarray(stream[: num_windows * self.window_len], np.int32).reshape(
      num_windows, self.window_len
    )

  def __len__(self) -> int:
    return len(self._windows)

  def window(self, index: int) -> np.ndarray:
    """The raw ``seq_len + 1`` tokens of window ``index``."""
    return self._windows[index]

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    window = self.window(index)
    return {'inputs': window[:-1], 'targets': window[1:]}
