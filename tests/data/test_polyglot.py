"""polyglot-synth (issue 13, part 5): the Bayes floor against brute-force
enumeration, the packed-stream floor, NMI on planted labels, the pipeline hook."""

import itertools
import math

import ml_collections
import numpy as np
import pytest

from moejax.data import polyglot
from moejax.errors import ConfigError


def tiny_languages():
  """K=2 chains over 3 symbols with some zero transitions (the posterior can
  rule a language out): prior (0.3, 0.7)."""
  init = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
  trans = np.array(
    [
      [[0.1, 0.9, 0.0], [0.6, 0.0, 0.4], [0.3, 0.3, 0.4]],
      [[0.2, 0.2, 0.6], [0.0, 0.5, 0.5], [0.7, 0.1, 0.2]],
    ]
  )
  return polyglot.Languages(np.array([0.3, 0.7]), init, trans, "abc")


def joint(langs, seq):
  """p(seq) = sum_k prior_k init_k(x_0) prod_t trans_k(x_{t-1}, x_t), by loops."""
  total = 0.0
  for k, prior in enumerate(langs.prior):
    p = prior * langs.init[k, seq[0]]
    for prev, cur in zip(seq, seq[1:]):
      p *= langs.trans[k, prev, cur]
    total += p
  return total


def test_floor_equals_brute_force_enumeration():
  langs, length = tiny_languages(), 4
  seqs = list(itertools.product(range(3), repeat=length))
  probs = {s: joint(langs, s) for s in seqs}
  prefix = {}  # P(x_<=t): the sum of the full sequences that start with it
  for s, p in probs.items():
    for t in range(1, length + 1):
      prefix[s[:t]] = prefix.get(s[:t], 0.0) + p
  assert sum(probs.values()) == pytest.approx(1.0, abs=1e-15)
  support = [s for s in seqs if probs[s] > 0]
  losses = polyglot.predictive_losses(langs, np.array(support))
  expected = np.array(
    [
      [-math.log(prefix[s[: t + 1]] / (prefix[s[:t]] if t else 1.0)) for t in range(length)]
      for s in support
    ]
  )
  np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-12)
  # Expected per-token floor = the mixture's entropy per symbol, by enumeration.
  weights = np.array([probs[s] for s in support])
  entropy = -sum(p * math.log(p) for p in weights) / length
  assert float(weights @ losses.mean(axis=1)) == pytest.approx(entropy, abs=1e-12)


def test_stream_floor_scores_the_evaluated_targets():
  langs = tiny_languages()
  docs = np.array([[0, 1, 0, 1], [2, 0, 2, 0], [1, 2, 2, 1]])
  losses = polyglot.predictive_losses(langs, docs)
  # seq_len = doc_len: window i = doc i + separator; targets x_2..x_4 and the separator.
  aligned = polyglot.stream_floor(langs, docs, seq_len=4)
  assert aligned["floor_nats"] == pytest.approx(losses[:, 1:].sum() / 12, abs=1e-15)
  assert aligned["floor_bpb"] == pytest.approx(aligned["floor_nats"] / math.log(2))
  # seq_len 2: windows of 3 over the stream d0 . d1 . d2 . (15 tokens, 5 windows);
  # window w's first token (stream position 3w) is not a target.
  stream = np.concatenate([losses, np.zeros((3, 1))], axis=1).ravel()
  first_two = polyglot.stream_floor(langs, docs, seq_len=2, num_windows=2)
  assert first_two["floor_nats"] == pytest.approx(stream[[1, 2, 4, 5]].mean(), abs=1e-15)
  with pytest.raises(ValueError, match="num_windows=6"):
    polyglot.stream_floor(langs, docs, seq_len=2, num_windows=6)
  labels = polyglot.token_languages([0, 1, 1], doc_len=4, seq_len=2, num_windows=5)
  # inputs are stream positions (0, 1), (3, 4), (6, 7), (9, 10), (12, 13); doc 0 holds 0-4
  np.testing.assert_array_equal(labels.ravel(), [0, 0, 0, 0, 1, 1, 1, 1, 1, 1])


def test_generated_documents_follow_their_chains_and_the_seed():
  cfg = {
    "polyglot": dict(
      num_languages=3,
      pool_size=10,
      alphabet_size=6,
      branching=2,
      doc_len=20,
      train_docs=64,
      eval_docs=16,
      seed=5,
    )
  }
  langs, splits = polyglot.build(cfg)
  docs, labels = splits["train"]
  assert docs.shape == (64, 20) and set(labels) == {0, 1, 2}
  assert np.all(langs.init[labels, docs[:, 0]] > 0)
  assert np.all(langs.trans[labels[:, None], docs[:, :-1], docs[:, 1:]] > 0)
  assert np.all((langs.trans > 0).sum(axis=2)[langs.init > 0] == 2)  # sparse: 2 successors
  name, texts = polyglot.split_texts(cfg)
  assert name == polyglot.split_texts(cfg)[0] and texts == polyglot.split_texts(cfg)[1]
  other = polyglot.split_texts({"polyglot": {**cfg["polyglot"], "seed": 6}})
  assert other[0] != name and other[1]["train"] != texts["train"]
  assert texts["validation"][0] == "".join(langs.symbols[i] for i in splits["validation"][0][0])
  # The floor is below a known-language model's loss plus log K, above its loss.
  floor = polyglot.predictive_losses(langs, docs).sum(axis=1)
  oracle = -np.log(langs.init[labels, docs[:, 0]]) - np.log(
    langs.trans[labels[:, None], docs[:, :-1], docs[:, 1:]]
  ).sum(axis=1)
  assert np.all(floor >= oracle - 1e-9) and np.all(floor <= oracle - np.log(1 / 3) + 1e-9)


@pytest.mark.parametrize(
  "settings, message",
  [
    ({"alphabet_size": 30}, r"data\.polyglot\.alphabet_size=30 must be <= 24"),
    ({"doc_len": 0}, r"data\.polyglot\.doc_len=0 must be an int >= 1"),
    ({"languages": 2}, r"data\.polyglot\.languages is not a setting"),
  ],
)
def test_bad_settings_are_named(settings, message):
  with pytest.raises(ConfigError, match=message):
    polyglot.settings_of({"polyglot": settings})


def test_config_defaults_are_the_modules():
  from moejax.config import base_config

  assert base_config().data.polyglot.to_dict() == polyglot.DEFAULTS


def test_steps_to_within_five_percent():
  history = [
    {"step": 10, "val_bpb": 2.0},
    {"step": 20, "loss": 1.0},
    {"step": 30, "val_bpb": 1.06},
    {"step": 40, "val_bpb": 1.04},
  ]
  assert polyglot.steps_to_within(history, 1.0) == 40
  assert polyglot.steps_to_within(history, 1.0, tolerance=0.1) == 30
  assert polyglot.steps_to_within(history, 0.5) is None


def test_pipeline_serves_the_generated_windows(tmp_path):
  from moejax.data.pipeline import build_lm_data

  cfg = ml_collections.ConfigDict(
    dict(
      name="polyglot_synth",
      seq_len=16,
      batch_size=4,
      data_dir=str(tmp_path),
      polyglot=dict(
        num_languages=2,
        pool_size=8,
        alphabet_size=5,
        branching=2,
        doc_len=16,
        train_docs=32,
        eval_docs=8,
        seed=1,
      ),
    )
  )
  data = build_lm_data(cfg, seed=0)
  _, splits = polyglot.build(cfg)
  langs, _ = polyglot.build(cfg)
  batch = next(data.eval_batches(1))
  first = "".join(langs.symbols[i] for i in splits["validation"][0][0])
  assert bytes(batch["inputs"][0].astype(np.uint8)).decode() == first
  assert batch["targets"][0, -1] == 0 and data.bytes_per_token == 1.0  # the separator
  assert data.num_eval_batches == 2 and not list(tmp_path.iterdir())  # nothing cached


def test_config_windows_are_whole_documents():
  from moejax.validation import validate_config
  from moejax.configs import polyglot_synth

  c = polyglot_synth.get_config("top_k=1")
  validate_config(c)
  assert c.data.name == polyglot.NAME and c.model.moe.top_k == 1
  assert c.data.seq_len == c.data.polyglot.doc_len  # every window: one document + separator
  assert c.train.eval_batches * c.data.batch_size == c.data.polyglot.eval_docs
