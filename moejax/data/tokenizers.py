"""Tokenizers: text <-> int32 token ids, chosen by name with ``get_tokenizer``.

Every tokenizer has ``vocab_size``, ``eos_id`` (the document separator used
when packing), ``encode(str) -> np.int32[n]`` and ``decode(ids) -> str``.

* ``byte`` (default): UTF-8 bytes, vocab 256, lossless, nothing to train.
  Separator: byte 0 (NUL), which never occurs in the shipped texts, so it is
  unambiguous without growing the vocabulary past 256.
* ``sentencepiece``: BPE trained on the train split and cached as a model
  file. Lossless too: identity normalisation, whitespace kept as is, '\\n' a
  piece of its own, and byte fallback for characters it has not seen.
  Separator: the model's ``</s>`` (id 2; ids 0 and 1 are <unk> and <s>).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np
import sentencepiece as spm

from moejax.data.storage import atomic_write_bytes, exclusive_lock
from moejax.errors import ConfigError, choice_error

# <unk>, <s>, </s>, 256 byte-fallback pieces and '\n': the trainer also needs
# one piece per distinct character (about 340 in all for Shakespeare).
SENTENCEPIECE_MIN_VOCAB = 3 + 256 + 1


class Tokenizer(Protocol):
  vocab_size: int
  eos_id: int

  def encode(self, text: str) -> np.ndarray: ...

  def decode(self, ids) -> str: ...


class ByteTokenizer:
  """UTF-8 bytes as tokens; decode replaces invalid byte sequences with U+FFFD."""

  vocab_size = 256
  eos_id = 0

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode('utf-8'), dtype=np.uint8).astype(np.int32)

  def decode(self, ids) -> str:
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
      raise ValueError(f'byte ids must be in [0, 256), got [{ids.min()}, {ids.max()}]')
    return ids.astype(np.uint8).tobytes().decode('utf-8', errors='replace')


class SentencePieceTokenizer:
  """A trained SentencePiece model (see module doc for its settings)."""

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
    self.vocab_size = self._processor.vocab_size()
    self.eos_id = self._processor.eos_id()

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int) -> SentencePieceTokenizer:
    """Trains BPE on the lines of ``texts``; ConfigError if the vocab does not fit."""
    lines = (line for text in texts for line in text.split('\n') if line)
    model = io.BytesIO()
    try:
      spm.SentencePieceTrainer.train(
        sentence_iterator=lines,
        model_writer=model,
        model_type='bpe',
        vocab_size=vocab_size,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name='identity',
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        user_defined_symbols=['\n'],
        num_threads=4,
        minloglevel=2,
      )  # Fixed: the file records it.
    except RuntimeError as e:
      raise ConfigError(
        f'data.vocab_size={vocab_size} does not suit sentencepiece on this corpus: {e}'
      ) from e
    return cls(model.getvalue())

  @classmethod
  def load_or_train(
    cls, model_path: str, vocab_size: int, train_texts: Callable[[], Iterable[str]]
  ) -> SentencePieceTokenizer:
    """Loads ``model_path``, training and writing it first if it is missing.

    Training runs under a file lock and the model is always read back from the
    file, so racing processes (e.g. data-parallel hosts) share one model.
    """
    if not os.path.exists(model_path):
      with exclusive_lock(model_path + '.lock'):
        if not os.path.exists(model_path):
          atomic_write_bytes(model_path, cls.train(train_texts(), vocab_size).model_proto)
    with open(model_path, 'rb') as f:
      return cls(f.read())

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._processor.encode(text), dtype=np.int32)

  def decode(self, ids) -> str:
    return self._processor.decode(np.asarray(ids).tolist())


def _make_byte(**unused) -> ByteTokenizer:
  del unused
  return ByteTokenizer()


def _make_sentencepiece(
  *, vocab_size: int, model_path: str, train_texts: Callable[[], Iterable[str]]
) -> SentencePieceTokenizer:
  return SentencePieceTokenizer.load_or_train(model_path, vocab_size, train_texts)


TOKENIZERS: dict[str, Callable[..., Tokenizer]] = {
  'byte': _make_byte,
  'sentencepiece': _make_sentencepiece,
}


def check_tokenizer_settings(name: str, vocab_size: int | None) -> None:
  """Cheap checks, run before any data is read: name known, vocab big enough."""
  if name not in TOKENIZERS:
    raise choice_error('data.tokenizer', name, TOKENIZERS)
  if name == 'sentencepiece' and not (
    isinstance(vocab_size, int) and vocab_size >= SENTENCEPIECE_MIN_VOCAB
  ):
    raise ConfigError(
      f'data.vocab_size={vocab_size!r} must be an int >= '
      f'{SENTENCEPIECE_MIN_VOCAB} for data.tokenizer=sentencepiece'
    )


def get_tokenizer(
  name: str,
  *,
  vocab_size: int | None = None,
  model_path: str | None = None,
  train_texts: Callable[[], Iterable[str]] | None = None,
) -> Tokenizer:
  """The tokenizer registered as ``name``.

  ``sentencepiece`` needs ``vocab_size``, ``model_path`` (cache file) and
  ``train_texts`` (called only when the cache file is missing); ``byte``
  ignores them.
  """
  check_tokenizer_settings(name, vocab_size)
  return TOKENIZERS[name](vocab_size=vocab_size, model_path=model_path, train_texts=train_texts)
