r"""The rows per token id of L3's tables (Tseng & De Sa, arXiv 2601.21461), computed
from data and passed to the model (moejax/layers/lookup.py allocates none itself:
building a model reads no corpus).

Every id gets one row (the embedding-table case); the other R - V rows are split in
proportion to a per-id weight (lookup.allocate_rows, water-filled at the cap). The
weights (model.l3.allocation) come from a token stream (model.l3.corpus: a built-in
corpus's train split, or 'train_split', the run's own training data through its
tokenizer):
  lzw        the paper's rule is "LZW-inspired, information-theoretic" with a
             per-token cap (512); its exact form was not readable here, so this
             is a GUESS: run LZW over the training token stream and count, per
             token id, the dictionary phrases that end in it, i.e. the distinct
             contexts the token is seen in often enough to earn a phrase (it
             grows sub-linearly with frequency, unlike `frequency`).
  frequency  unigram counts of the training split.
  uniform    all ones (no data read).

    rows = l3_rows(config)            # [V] int, or None without L3
    model = Decoder(config.model, rngs=..., l3_rows=rows)
"""

import functools
import json

import ml_collections
import numpy as np

from moejax.data import shakespeare
from moejax.data.pipeline import train_token_stream
from moejax.errors import ConfigError
from moejax.layers.lookup import allocate_rows

ALLOCATIONS = ("lzw", "frequency", "uniform")
CORPORA = {"shakespeare": False, "shakespeare_folio": True}  # name -> include Folio texts
# model.l3.corpus: the training split of the run's own data, through its tokenizer
# (any vocabulary; moejax.data.pipeline.train_token_stream).
TRAIN_SPLIT = "train_split"


def lzw_phrase_counts(stream, vocab_size: int) -> np.ndarray:
  """Per token id, how many LZW dictionary phrases end in it (one pass)."""
  counts = np.zeros(vocab_size, np.int64)
  ids = np.asarray(stream).tolist()
  if not ids:
    return counts
  table: dict[tuple[int, int], int] = {}
  next_code, code = vocab_size, ids[0]
  for tok in ids[1:]:
    found = table.get((code, tok))
    if found is None:
      table[(code, tok)] = next_code
      next_code, code = next_code + 1, tok
      counts[tok] += 1
    else:
      code = found
  return counts


def corpus_stream(corpus: str) -> np.ndarray:
  """The byte-token stream of a built-in corpus's *train* split, documents
  separated by eos 0, as moejax/data/pipeline.py packs it (no TFDS needed)."""
  texts = [t for t in shakespeare.list_source_texts(CORPORA[corpus]) if t.split == "train"]
  docs = [
    shakespeare.strip_gutenberg_boilerplate(t.path.read_text(encoding="utf-8")) for t in texts
  ]
  return np.frombuffer(b"\0".join(d.encode("utf-8") for d in docs) + b"\0", np.uint8)


def weights_of_stream(rule: str, stream, vocab_size: int) -> np.ndarray:
  """Allocation weights [V] by `rule` (lzw | frequency) from a token stream."""
  if rule == "lzw":
    return lzw_phrase_counts(stream, vocab_size).astype(np.float64)
  return np.bincount(np.asarray(stream), minlength=vocab_size).astype(np.float64)


@functools.lru_cache(maxsize=8)
def token_weights(rule: str, corpus: str, vocab_size: int) -> np.ndarray:
  """Allocation weights [V] by `rule` (lzw | frequency) from a built-in `corpus`'s
  train split (cached)."""
  return weights_of_stream(rule, corpus_stream(corpus), vocab_size)


@functools.lru_cache(maxsize=4)
def train_split_weights(rule: str, data_json: str, vocab_size: int) -> np.ndarray:
  """Allocation weights [V] by `rule` from the training split of the data config
  `data_json` (cached: a run's model and its checks count once)."""
  stream = train_token_stream(ml_collections.ConfigDict(json.loads(data_json)))
  return weights_of_stream(rule, stream, vocab_size)


def allocation_weights(config) -> np.ndarray:
  """The weights [V] the run's L3 layers allocate rows by (model.l3.allocation over
  model.l3.corpus; the run's own training split for 'train_split')."""
  m = config.model
  l3 = m.l3
  if l3.allocation == "uniform":
    return np.ones(m.vocab_size)
  if l3.corpus == TRAIN_SPLIT:
    return train_split_weights(l3.allocation, config.data.to_json(sort_keys=True), m.vocab_size)
  return token_weights(l3.allocation, l3.corpus, m.vocab_size)


def l3_rows(config) -> np.ndarray | None:
  """Rows per token id [V] of the run's L3 tables (every L3 layer shares the
  allocation); None when model.l3 is off."""
  l3 = config.model.get("l3")
  if l3 is None or not l3.enabled:
    return None
  return allocate_rows(allocation_weights(config), l3.budget, l3.cap)


def validate_allocation(c) -> None:
  """ConfigError for a bad allocation rule or corpus of `model.l3` (validate_config)."""
  m, l3 = c.model, c.model.l3
  if not l3.enabled:
    return
  if l3.allocation not in ALLOCATIONS:
    raise ConfigError(
      f"model.l3.allocation={l3.allocation!r} is not known; valid: {', '.join(ALLOCATIONS)}"
    )
  if l3.allocation != "uniform" and l3.corpus != TRAIN_SPLIT:
    if l3.corpus not in CORPORA:
      raise ConfigError(
        f"model.l3.corpus={l3.corpus!r} is not known; valid: {', '.join((*CORPORA, TRAIN_SPLIT))}"
      )
    if c.data.tokenizer != "byte" or m.vocab_size < 256:
      raise ConfigError(
        f"model.l3.allocation={l3.allocation!r} counts byte tokens of "
        f"model.l3.corpus={l3.corpus!r}: needs data.tokenizer='byte' "
        f"(is {c.data.tokenizer!r}) and model.vocab_size >= 256 "
        f"(is {m.vocab_size})"
      )
