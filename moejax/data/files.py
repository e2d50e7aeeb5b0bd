"""The user's own text: a glob of .txt / .jsonl files as a streamed LM dataset.

``data.name='files'`` reads ``data.files.train`` and ``data.files.eval``
(globs, ``**`` allowed; sorted path order). A .txt file is one document; a
.jsonl file holds one document per non-blank line, its text under
``data.text_key``. With ``data.files.eval`` unset, the held-out files are
carved out whole: every 10th matched file in sorted order (indices 0, 10, 20,
...), so at least two files are needed.

The corpus is never held in memory. One scan records each document's byte
range (a .txt file is split at newlines into pieces of about
``PIECE_BYTES`` for learned tokenizers; with the byte tokenizer the file
itself is the piece and the scan only reads its size) and its token count.
``StreamedWindows[i]`` then reads, decodes and tokenizes only the pieces that
window ``i`` overlaps. Its windows are exactly those of
``PackedWindows(pack_documents(documents, eos_id), seq_len)``, so shuffling,
sharding and exact resume are grain's index-based ones, as in memory.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from moejax.data.tokenizers import ByteTokenizer, Tokenizer
from moejax.errors import ConfigError

SUFFIXES = ('.txt', '.jsonl')
HELD_OUT_EVERY = 10  # with data.files.eval unset: files 0, 10, 20, ... are held out
PIECE_BYTES = 4096  # .txt pieces for learned tokenizers end at the first '\n' past this


def resolve_files(files_cfg) -> dict[str, list[str]]:
  """{'train': paths, 'eval': paths} from the ``data.files`` globs; ConfigError for an
  unset or empty glob, a file that is not .txt/.jsonl, or a file in both splits."""
  train_glob, eval_glob = files_cfg.get('train'), files_cfg.get('eval')
  if not train_glob:
    raise ConfigError(
      'data.files.train is unset (data.name=files needs a glob of .txt or .jsonl files)'
    )
  train = _match('train', train_glob)
  if eval_glob:
    held_out = _match('eval', eval_glob)
    shared = sorted(set(train) & set(held_out))
    if shared:
      raise ConfigError(
        f'data.files.eval={eval_glob!r} and data.files.train={train_glob!r} '
        f'both match {shared[0]!r} (a held-out file must not be trained on)'
      )
    return {'train': train, 'eval': held_out}
  if len(train) < 2:
    raise ConfigError(
      f'data.files.train={train_glob!r} matches {len(train)} file and '
      'data.files.eval is unset: give data.files.eval, or at least 2 files '
      f'(every {HELD_OUT_EVERY}th is held out whole)'
    )
  return {
    'train': [p for i, p in enumerate(train) if i % HELD_OUT_EVERY],
    'eval': train[::HELD_OUT_EVERY],
  }


def _match(split: str, pattern: str) -> list[str]:
  paths = sorted(os.path.abspath(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True))
  if not paths:
    raise ConfigError(f'data.files.{split}={pattern!r} matches no file')
  for path in paths:
    if not (os.path.isfile(path) and path.endswith(SUFFIXES)):
      raise ConfigError(
        f'data.files.{split}={pattern!r} matches {path!r}, which is not a '
        f"{' or '.join(SUFFIXES)} file"
      )
  return paths


class StreamedWindows:
  """Random-access LM windows of a list of files, read lazily (a grain source).

  ``windows[i]`` is ``{'inputs': int32[seq_len], 'targets': int32[seq_len]}``;
  ``num_tokens`` and ``num_text_bytes`` count the whole stream (separators
  included in both), for bits per byte.
  """

  def __init__(
    self, paths: Sequence[str], tokenizer: Tokenizer, seq_len: int, text_key: str = 'text'
  ):
    self._paths, self._tokenizer, self._text_key = list(paths), tokenizer, text_key
    self._raw_bytes = isinstance(tokenizer, ByteTokenizer)
    self.seq_len, self.window_len = seq_len, seq_len + 1
    pieces = [piece for index in range(len(self._paths)) for piece in self._scan(index)]
    self._file, self._start, self._stop, self._ends_doc = (
      np.array(column, dtype)
      for column, dtype in zip(
        zip(*pieces) if pieces else ([],) * 4, (np.int32, np.int64, np.int64, bool)
      )
    )
    counts = np.array([self._count(j) for j in range(len(self._file))], np.int64).reshape(-1, 2)
    lengths = counts[:, 0] + self._ends_doc
    self._offsets = np.concatenate([[0], np.cumsum(lengths)])
    self.num_tokens = int(self._offsets[-1])
    self.num_text_bytes = int(counts[:, 1].sum() + self._ends_doc.sum())
    self._num_windows = self.num_tokens // self.window_len

  def texts(self) -> Iterator[str]:
    """Every document's text in order (pieces joined), e.g. to train a tokenizer."""
    parts = []
    for j in range(len(self._file)):
      parts.append(self._text(j))
      if self._ends_doc[j]:
        yield ''.join(parts)
        parts = []

  def __len__(self) -> int:
    return self._num_windows

  def window(self, index: int) -> np.ndarray:
    """The raw ``seq_len + 1`` tokens of window ``index``."""
    if not 0 <= index < self._num_windows:
      raise IndexError(f'window {index} of {self._num_windows}')
    lo, hi = index * self.window_len, (index + 1) * self.window_len
    first = int(np.searchsorted(self._offsets, lo, side='right')) - 1
    parts = []
    for j in range(first, len(self._file)):
      start = int(self._offsets[j])
      if start >= hi:
        break
      parts.append(self._tokens(j, max(lo - start, 0), hi - start))
    return np.concatenate(parts)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    window = self.window(index)
    return {'inputs': window[:-1], 'targets': window[1:]}

  def _scan(self, index: int) -> Iterator[tuple[int, int, int, bool]]:
    """(file, byte start, byte stop, ends a document) of each piece of file ``index``."""
    path = self._paths[index]
    if path.endswith('.txt') and self._raw_bytes:
      yield index, 0, os.path.getsize(path), True
      return
    with open(path, 'rb') as f:
      start = position = 0
      for number, line in enumerate(f, 1):
        position += len(line)
        if path.endswith('.jsonl'):
          if line.strip():
            _document_text(line, self._text_key, path, number)  # checks the line
            yield index, start, position, True
          start = position
        elif position - start >= PIECE_BYTES:
          yield index, start, position, False
          start = position
      if path.endswith('.txt'):
        yield index, start, position, True

  def _read(self, j: int, start: int = 0, stop: int | None = None) -> bytes:
    """Bytes [start, stop) of piece ``j`` (default all of it)."""
    begin, end = int(self._start[j]), int(self._stop[j])
    with open(self._paths[self._file[j]], 'rb') as f:
      f.seek(begin + start)
      return f.read((end - begin if stop is None else stop) - start)

  def _text(self, j: int) -> str:
    raw = self._read(j)
    path = self._paths[self._file[j]]
    if path.endswith('.jsonl'):
      return _document_text(raw, self._text_key, path, None)
    return raw.decode('utf-8', errors='replace')

  def _is_raw(self, j: int) -> bool:
    return self._raw_bytes and self._paths[self._file[j]].endswith('.txt')

  def _count(self, j: int) -> tuple[int, int]:
    """(tokens, UTF-8 bytes) of piece ``j``, separator excluded."""
    if self._is_raw(j):
      size = int(self._stop[j] - self._start[j])
      return size, size
    text = self._text(j)
    return len(self._tokenizer.encode(text)), len(text.encode('utf-8'))

  def _tokens(self, j: int, lo: int, hi: int) -> np.ndarray:
    """Tokens [lo, hi) of piece ``j`` followed by its separator, if it ends a document."""
    count = int(self._offsets[j + 1] - self._offsets[j]) - int(self._ends_doc[j])
    if self._is_raw(j):
      body = np.frombuffer(self._read(j, lo, min(hi, count)) if lo < count else b'', np.uint8)
    else:
      body = self._tokenizer.encode(self._text(j))[lo:hi]
    tail = [self._tokenizer.eos_id] if self._ends_doc[j] and hi > count else []
    return np.concatenate([body.astype(np.int32), np.array(tail, np.int32)])


def _document_text(line: bytes, text_key: str, path: str, number: int | None) -> str:
  """The text of one .jsonl line; ConfigError naming the file and line if it has none."""
  where = f'{path}:{number}' if number else path
  try:
    record = json.loads(line)
  except ValueError as e:
    raise ConfigError(f'{where} is not a JSON line ({e})') from None
  if not isinstance(record, dict) or text_key not in record:
    raise ConfigError(f'data.text_key={text_key!r} is not a key of line {where}')
  if not isinstance(record[text_key], str):
    raise ConfigError(
      f'data.text_key={text_key!r} of line {where} is a '
      f'{type(record[text_key]).__name__}, not a string'
    )
  return record[text_key]


def streamed_splits(
  files_cfg,
  tokenizer_for: Callable[[Callable[[], Iterator[str]]], Tokenizer],
  seq_len: int,
  text_key: str,
) -> tuple[Tokenizer, dict[str, StreamedWindows]]:
  """Tokenizer and {'train_split', 'eval_split'} windows of ``data.files``.

  ``tokenizer_for(train_texts)`` builds the tokenizer; ``train_texts()`` streams the
  training documents. Every line is checked before the tokenizer is built.
  """
  paths = resolve_files(files_cfg)
  byte_tokenizer = ByteTokenizer()
  # A first scan with bytes checks every file (and is all the work for .txt).
  checked = {
    split: StreamedWindows(p, byte_tokenizer, seq_len, text_key) for split, p in paths.items()
  }
  tokenizer = tokenizer_for(checked['train'].texts)
  if isinstance(tokenizer, ByteTokenizer):
    return tokenizer, {'train_split': checked['train'], 'eval_split': checked['eval']}
  return tokenizer, {
    f'{split}_split': StreamedWindows(p, tokenizer, seq_len, text_key) for split, p in paths.items()
  }
