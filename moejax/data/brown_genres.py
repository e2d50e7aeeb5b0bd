"""Brown-corpus genre classification passages, from the `mix` corpus's prose domain.

Every prose document of `mix` (moejax/data/mix.py) is one file of the Brown corpus
titled 'prose/<genre>/<file>', over the corpus's 15 genres; the validation split
holds 10% of every genre's files, whole, so a passage of a held-out file shares no
text with the training files. A passage is `length` bytes (the byte tokenizer's
tokens) starting at a uniformly drawn offset of a uniformly drawn file of its genre;
its label is the genre's index in sorted order. Passages are drawn per genre in
equal numbers, so chance accuracy is 1 / (number of genres).
"""

from __future__ import annotations

import numpy as np

from moejax.data import builders
from moejax.data.pipeline import OPTIONAL_DEFAULTS
from moejax.data.storage import resolve_data_dir
from moejax.errors import ConfigError

DATASET = "mix"
PROSE = "prose/"


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def genre_documents(data_cfg, split_key: str) -> dict[str, list[str]]:
  """{genre: texts of its Brown files} in the split data_cfg[split_key] of `mix`
  (data_cfg: a config's `data` section; its data_dir locates the dataset)."""
  settings = {key: data_cfg.get(key, default) for key, default in OPTIONAL_DEFAULTS.items()}
  settings["name"] = DATASET
  builder = builders.open_builder(DATASET, resolve_data_dir(settings["data_dir"]))
  source = builders.open_split(builder, settings, split_key)
  out: dict[str, list[str]] = {}
  for i in range(len(source)):
    example = source[i]
    title = _text(example["title"])
    if title.startswith(PROSE):
      out.setdefault(title.split("/")[1], []).append(_text(example[settings["text_key"]]))
  if not out:
    raise ConfigError(f"data.{split_key}={settings[split_key]!r} of mix holds no prose document")
  return out


def passages(
  documents: dict[str, list[str]], genres: list[str], length: int, per_genre: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """(tokens int32 [G * per_genre, length], labels int32 [G * per_genre]): per genre g
  (label genres.index(g)), per_genre passages of `length` bytes of its documents."""
  rng = np.random.default_rng(seed)
  tokens, labels = [], []
  for label, genre in enumerate(genres):
    texts = [np.frombuffer(t.encode("utf-8"), np.uint8) for t in documents.get(genre, [])]
    texts = [t for t in texts if len(t) >= length]
    if not texts:
      raise ConfigError(f"genre {genre!r} has no document of at least {length} bytes")
    for _ in range(per_genre):
      text = texts[rng.integers(len(texts))]
      start = rng.integers(len(text) - length + 1)
      tokens.append(text[start : start + length])
      labels.append(label)
  return np.stack(tokens).astype(np.int32), np.asarray(labels, np.int32)
