"""polyglot-synth: a planted task with an exactly known optimum.

K synthetic languages, each a sparse bigram Markov chain over its own alphabet:
a random subset of `alphabet_size` symbols from a pool of `pool_size` ASCII
letters shared by all languages (so alphabets overlap in part and a symbol
alone rarely names the language). Every symbol has `branching` successors with
Dirichlet(1) weights; the first symbol is uniform over the alphabet. A
document is `doc_len` symbols of one language drawn from a uniform prior, with
no tag. Everything comes from `data.polyglot.seed`, not the training seed, so
every training seed sees the same task.

    --config.data.name=polyglot_synth    (settings: config `data.polyglot`)

Bayes floor. A model that does not know the document's language must infer
it from the prefix; the optimal next-symbol distribution is the posterior
mixture  p(x_t | x_<t) = sum_k P(k | x_<t) p_k(x_t | x_{t-1}),  with
P(k | x_<t) proportional to prior_k p_k(x_<t) (the forward recursion over the
K chains; the chain's own state is the previous symbol, so it is observed).
`predictive_losses` gives -log p(x_t | x_<t) per symbol in float64; summed
over a document it is -log p(document) under the mixture (chain rule).
`stream_floor` averages those losses over exactly the target tokens the
trainer's evaluation scores: documents packed with a separator after each
(a zero-loss token for the floor: a bound, and with seq_len = doc_len every
window is one document and its separator, so it is attainable), windows of
seq_len + 1 whose first token is never a target (moejax/data/packing.py).
With the byte tokenizer bits/byte = nats / ln 2.

Report helpers: `moejax.evaluation.partitions.nmi` (language vs a model's top-1
expert), `steps_to_within`
(first logged step within 5% of the floor) and `token_languages`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import numpy as np

from moejax.errors import ConfigError

NAME = "polyglot_synth"
SYMBOLS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
DEFAULTS = dict(
  num_languages=4,
  pool_size=24,
  alphabet_size=12,
  branching=3,
  doc_len=128,
  train_docs=4096,
  eval_docs=512,
  seed=0,
)


@dataclasses.dataclass(frozen=True)
class Languages:
  """K bigram chains over a pool of V symbols: prior [K], init [K, V], trans [K, V, V]
  (rows of symbols outside a language's alphabet are zero), symbols: V chars."""

  prior: np.ndarray
  init: np.ndarray
  trans: np.ndarray
  symbols: str


def settings_of(cfg) -> dict:
  """data.polyglot (a ConfigDict or dict; missing keys at DEFAULTS), checked."""
  given = dict(cfg.get("polyglot", None) or {}) if cfg is not None else {}
  unknown = sorted(set(given) - set(DEFAULTS))
  if unknown:
    raise ConfigError(f"data.polyglot.{unknown[0]} is not a setting; valid: {', '.join(DEFAULTS)}")
  s = {**DEFAULTS, **given}
  for key, value in s.items():
    low = 0 if key == "seed" else 1
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
      raise ConfigError(f"data.polyglot.{key}={value!r} must be an int >= {low}")
  for small, big in (
    ("pool_size", len(SYMBOLS)),
    ("alphabet_size", s["pool_size"]),
    ("branching", s["alphabet_size"]),
  ):
    if s[small] > big:
      raise ConfigError(f"data.polyglot.{small}={s[small]} must be <= {big}")
  return s


def make_languages(
  num_languages: int, pool_size: int, alphabet_size: int, branching: int, rng: np.random.Generator
) -> Languages:
  """Random sparse bigram chains (see module doc), as float64 tables."""
  k, v = num_languages, pool_size
  init, trans = np.zeros((k, v)), np.zeros((k, v, v))
  for lang in range(k):
    alphabet = np.sort(rng.choice(v, alphabet_size, replace=False))
    init[lang, alphabet] = 1 / alphabet_size
    for symbol in alphabet:
      successors = rng.choice(alphabet, branching, replace=False)
      trans[lang, symbol, successors] = rng.dirichlet(np.ones(branching))
  return Languages(np.full(k, 1 / k), init, trans, SYMBOLS[:v])


def sample_documents(
  langs: Languages, num_docs: int, doc_len: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
  """(documents int[N, doc_len] of symbol ids, their languages int[N])."""
  labels = rng.choice(len(langs.prior), num_docs, p=langs.prior)
  docs = np.zeros((num_docs, doc_len), np.int64)
  docs[:, 0] = _draw(langs.init[labels], rng)
  for t in range(1, doc_len):
    docs[:, t] = _draw(langs.trans[labels, docs[:, t - 1]], rng)
  return docs, labels


def _draw(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """One draw per row of probs [N, V] (inverse CDF)."""
  cdf = np.cumsum(probs, axis=1)
  u = rng.random(len(probs))[:, None] * cdf[:, -1:]
  return np.minimum((cdf <= u).sum(axis=1), probs.shape[1] - 1)


def _logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
  top = np.max(a, axis=axis, keepdims=True)
  top = np.where(np.isfinite(top), top, 0.0)
  with np.errstate(divide="ignore"):
    return np.squeeze(top, axis) + np.log(np.sum(np.exp(a - top), axis=axis))


def predictive_losses(langs: Languages, docs) -> np.ndarray:
  """-log p(x_t | x_<t) under the posterior mixture over languages, float64 [N, L]."""
  docs = np.asarray(docs, np.int64)
  with np.errstate(divide="ignore"):
    log_init, log_trans = np.log(langs.init), np.log(langs.trans)
    log_w = np.broadcast_to(np.log(langs.prior), (len(docs), len(langs.prior))).copy()
  losses = np.zeros(docs.shape)
  for t in range(docs.shape[1]):
    step = (
      log_init[:, docs[:, 0]] if t == 0 else log_trans[:, docs[:, t - 1], docs[:, t]]
    ).T  # [N, K]
    losses[:, t] = _logsumexp(log_w) - _logsumexp(log_w + step)
    log_w = log_w + step
  return losses


def stream_floor(langs: Languages, docs, seq_len: int, num_windows: int | None = None) -> dict:
  """The Bayes floor over the target tokens of the first `num_windows` (None: all)
  packed windows of seq_len + 1 tokens (see module doc): nats/token and bits/byte."""
  losses = predictive_losses(langs, docs)
  stream = np.concatenate([losses, np.zeros((len(losses), 1))], axis=1).reshape(-1)
  window = seq_len + 1
  available = len(stream) // window
  count = available if num_windows is None else num_windows
  if not 1 <= count <= available:
    raise ValueError(f"num_windows={num_windows} must be in [1, {available}]")
  targets = stream[: count * window].reshape(count, window)[:, 1:]
  nats = float(targets.mean())
  return {"floor_nats": nats, "floor_bpb": nats / math.log(2)}


def token_languages(labels, doc_len: int, seq_len: int, num_windows: int) -> np.ndarray:
  """The language of each input token of the first `num_windows` windows, [W, seq_len]
  (a separator counts for the document it ends), aligned with the model's inputs."""
  stream = np.repeat(np.asarray(labels), doc_len + 1)
  window = seq_len + 1
  return stream[: num_windows * window].reshape(num_windows, window)[:, :-1]


def steps_to_within(
  history, floor: float, key: str = "val_bpb", tolerance: float = 0.05
) -> int | None:
  """The first logged step whose `key` is within `tolerance` (relative) of the floor."""
  for record in sorted((r for r in history if key in r), key=lambda r: r["step"]):
    if record[key] <= floor * (1 + tolerance):
      return int(record["step"])
  return None


def build(cfg) -> tuple[Languages, dict]:
  """(languages, {split: (docs, labels)}) for config `data` (splits train, validation)."""
  s = settings_of(cfg)
  lang_rng, train_rng, eval_rng = (
    np.random.default_rng(seq) for seq in np.random.SeedSequence(s["seed"]).spawn(3)
  )
  langs = make_languages(
    s["num_languages"], s["pool_size"], s["alphabet_size"], s["branching"], lang_rng
  )
  return langs, {
    "train": sample_documents(langs, s["train_docs"], s["doc_len"], train_rng),
    "validation": sample_documents(langs, s["eval_docs"], s["doc_len"], eval_rng),
  }


def split_texts(cfg) -> tuple[str, dict[str, list[str]]]:
  """(dataset id, {split: document texts}) for the data pipeline (one ASCII byte per
  symbol); the id names the settings, for caches keyed by dataset."""
  s = settings_of(cfg)
  langs, splits = build(cfg)
  table = np.array(list(langs.symbols))
  texts = {split: ["".join(table[doc]) for doc in docs] for split, (docs, _) in splits.items()}
  digest = hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()[:12]
  return f"{NAME}-{digest}", texts
