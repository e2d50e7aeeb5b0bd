"""L3 Large Lookup Layer (moejax/layers/lookup.py): sparse gradients, the padded
lookup against a per-token loop, the row allocation, bad config, and a tiny LM."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings, strategies as st

from moejax.configs import lm_shakespeare_l3
from moejax.data import l3_allocation
from moejax.validation import validate_config
from moejax.errors import ConfigError
from moejax.layers import lookup
from moejax.train import step as step_lib
from moejax.train.checkpoint import Checkpointer
from moejax.train.loop import init_state, train_and_evaluate

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


class L3Cfg:
  d_emb, d_up, cap = 3, 5, 6


def random_params(rng, budget, d_in, cfg=L3Cfg, dtype=np.float64):
  shapes = {
    "keys": (budget, d_in),
    "values": (budget, cfg.d_emb),
    "w_up": (cfg.d_emb, cfg.d_up),
    "ln_scale": (cfg.d_up,),
    "ln_bias": (cfg.d_up,),
    "w_mix": (d_in + cfg.d_up, d_in),
  }
  return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}


def loop_reference(p, offsets, lengths, ids, x, eps=1e-5):
  """The L3 equation one token at a time in float64 numpy (no padding, no mask)."""
  outs = []
  for t, xn in zip(ids, x):
    rows = slice(offsets[t], offsets[t] + lengths[t])
    s = p["keys"][rows] @ xn
    a = np.exp(s - s.max())
    a /= a.sum()
    h = (p["values"][rows].T @ a) @ p["w_up"]
    h = (h - h.mean()) / np.sqrt(h.var() + eps) * p["ln_scale"] + p["ln_bias"]
    outs.append(np.concatenate([xn, h]) @ p["w_mix"])
  return np.stack(outs)


def check_lookup(lengths, ids, cap):
  offsets, lengths32 = lookup.csr_layout(lengths)
  rng = np.random.default_rng(int(np.sum(lengths)) * 31 + len(ids))
  p = random_params(rng, int(offsets[-1]), 4)
  x = rng.standard_normal((len(ids), 4))
  want = loop_reference(p, offsets, lengths, ids, x)
  # padded to cap, not max(lengths); one jit, not a compile per eager op of each new shape
  layer = jax.jit(
    lambda p, offsets, lengths, ids, x: lookup.l3_mix(
      p, x, lookup.l3_lookup(p, offsets, lengths, ids, x, max_len=cap)
    )
  )
  with jax.enable_x64(True):
    got = np.asarray(layer(*jax.tree.map(jnp.asarray, (p, offsets, lengths32, ids, x))))
  np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@settings(max_examples=8)  # each new shape compiles (suite budget)
@given(st.data(), st.integers(1, 6), st.integers(1, 8), st.integers(1, 12))
def test_padded_masked_lookup_equals_per_token_loop(data, vocab, cap, num_tokens):
  lengths = data.draw(st.lists(st.integers(1, cap), min_size=vocab, max_size=vocab))
  ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=num_tokens, max_size=num_tokens))
  check_lookup(np.array(lengths), np.array(ids), cap)


@pytest.mark.parametrize("lengths,cap", [([1, 1, 1], 1), ([1, 5, 1, 5], 5), ([5, 2], 5)])
def test_lookup_at_lengths_one_and_cap(lengths, cap):
  check_lookup(np.array(lengths), np.array([0, 1, 1, 0, len(lengths) - 1]), cap)


def test_gradients_reach_only_rows_of_ids_in_the_batch():
  # ids 0..4; the batch holds ids 1, 3 and 4 only (each with >= 2 rows: a lone
  # row's softmax weight is the constant 1, so its key would get no gradient).
  rows = np.array([1, 3, 4, 2, 5])
  layer = lookup.LookupLayer(6, L3Cfg, rows, rngs=nnx.Rngs(0), dtype=jnp.float32)
  ids = jnp.array([[4, 1, 4], [3, 3, 1]])
  x = jax.random.normal(jax.random.key(1), (2, 3, 6))
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

  def loss(params):
    return jnp.sum(jnp.sin(nnx.merge(graphdef, params, rest)(x, ids)))

  grads = jax.grad(loss)(params)
  offsets, _ = lookup.csr_layout(rows)
  for name in ("keys", "values"):
    g = np.asarray(grads[name][...])
    for t in range(len(rows)):
      norms = np.linalg.norm(g[offsets[t] : offsets[t + 1]], axis=-1)
      if t in (0, 2):
        assert np.all(norms == 0.0), (name, t, norms)  # exactly zero, not just small
      else:
        assert np.all(norms > 0.0), (name, t, norms)


@given(
  st.lists(st.integers(0, 1000), min_size=1, max_size=40), st.integers(1, 64), st.integers(0, 2000)
)
def test_allocation_sums_to_budget_within_cap_and_floor(counts, cap, extra):
  vocab = len(counts)
  budget = min(vocab + extra, cap * vocab)
  rows = lookup.allocate_rows(counts, budget, cap)
  assert rows.sum() == budget and rows.min() >= 1 and rows.max() <= cap
  c = np.asarray(counts)
  heavy, light = np.nonzero(c[:, None] > c[None, :])
  assert np.all(rows[heavy] >= rows[light])  # a heavier id never gets fewer rows
  if c.sum() > 0 and rows.max() < cap:
    target = 1 + (budget - vocab) * c / c.sum()  # no cap bound: largest remainder of target
    assert np.all(np.abs(rows - target) < 1)


def test_allocation_by_hand():
  # weights 6,3,1,0, budget 12, cap 5: one row each, spare 8 shared 4.8/2.4/0.8/0;
  # id 0 would reach 5.8 > 5: it gets the cap, the spare left (8 - 4 = 4) goes 3:1:0
  # to ids 1, 2, 3 -> 4, 2, 1.
  np.testing.assert_array_equal(lookup.allocate_rows([6, 3, 1, 0], 12, 5), [5, 4, 2, 1])
  # weights 5,3,2,0, budget 10, cap 8: targets 1+3, 1+1.8, 1+1.2, 1 -> floors 4,2,2,1
  # (9 rows); the 10th goes to the largest remainder (.8, id 1).
  np.testing.assert_array_equal(lookup.allocate_rows([5, 3, 2, 0], 10, 8), [4, 3, 2, 1])
  # LZW over "a a a a a a b" (a=0, b=1, c=2 unseen): new phrases aa, aaa (end in a),
  # aaab (ends in b) -> weights 2, 1, 0; frequency weights are 6, 1, 0.
  stream = [0, 0, 0, 0, 0, 0, 1]
  np.testing.assert_array_equal(l3_allocation.lzw_phrase_counts(stream, 3), [2, 1, 0])
  # budget 9, cap 9: spare 6 -> lzw 4:2:0 -> 5,3,1; frequency 36/7, 6/7, 0 -> targets
  # 6.14, 1.86, 1 -> floors 6,1,1 + the remainder .86 to id 1 -> 6,2,1.
  np.testing.assert_array_equal(lookup.allocate_rows([2, 1, 0], 9, 9), [5, 3, 1])
  np.testing.assert_array_equal(lookup.allocate_rows([6, 1, 0], 9, 9), [6, 2, 1])
  offsets, lengths = lookup.csr_layout([5, 3, 1])
  np.testing.assert_array_equal(offsets, [0, 5, 8, 9])
  np.testing.assert_array_equal(lengths, [5, 3, 1])


def tiny_l3(data_dir, **train):
  c = lm_shakespeare_l3.get_config("size=tiny")
  c.data.data_dir = data_dir
  c.train.progress_bar = False
  for key, value in train.items():
    c.train[key] = value
  return c


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("budget", 100, r"model\.l3\.budget=100 is smaller than model\.vocab_size=256"),
    ("cap", 0, r"model\.l3\.cap=0 must be >= 1"),
    ("cap", 2, r"model\.l3\.budget=1024 cannot be allocated: model\.l3\.cap=2"),
    (
      "layers",
      (2,),
      r"model\.l3\.layers=\(2,\) must be distinct block indices in \[0, "
      r"model\.num_layers=2\)",
    ),
    ("layers", (1, 1), r"model\.l3\.layers=\(1, 1\)"),
    ("layers", (), r"model\.l3\.layers=\(\)"),
    ("d_emb", 0, r"model\.l3\.d_emb=0 must be > 0"),
    ("allocation", "nope", r"model\.l3\.allocation='nope' is not known"),
    ("corpus", "nope", r"model\.l3\.corpus='nope' is not known"),
  ],
)
def test_bad_l3_config_is_rejected_before_compilation(tmp_path, monkeypatch, key, value, message):
  config = tiny_l3(str(tmp_path / "tfds"))
  config.model.l3[key] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config)
  compiled = []
  monkeypatch.setattr(step_lib, "make_train_step", lambda *a: compiled.append(a))
  with pytest.raises(ConfigError, match=message):
    train_and_evaluate(config, str(tmp_path / "run"), write_metrics=False)
  assert not compiled


@pytest.mark.integration
def test_tiny_l3_lm_learns_and_checkpoints_its_table(tmp_path):
  config = tiny_l3(str(tmp_path / "tfds"))
  run = train_and_evaluate(config, str(tmp_path / "run"), write_metrics=False)
  first, last = run.history[0]["ce_loss"], run.history[-1]["ce_loss"]
  assert first > last + 0.5, (first, last)
  assert run.eval["val_loss"] < math.log(256) - 0.5
  l3 = config.model.l3
  rows = lookup.allocate_rows(
    l3_allocation.token_weights(l3.allocation, l3.corpus, 256), l3.budget, l3.cap
  )
  table = run.state.rest["blocks"][1]["lookup"]
  np.testing.assert_array_equal(table["lengths"], rows)
  np.testing.assert_array_equal(table["offsets"], lookup.csr_layout(rows)[0])
  ckpt = Checkpointer(str(tmp_path / "run"), 2)
  _, state, _ = init_state(config)
  restored, _ = ckpt.restore(ckpt.latest_step(), jax.tree.map(np.asarray, state))
  np.testing.assert_array_equal(restored.rest["blocks"][1]["lookup"]["offsets"], table["offsets"])
  assert restored.params["blocks"][1]["lookup"]["keys"].shape == (l3.budget, config.model.d_model)


def test_train_split_allocation_counts_the_runs_own_sentencepiece_tokens(tmp_path):
  """model.l3.corpus='train_split' with a learned vocabulary: the table is allocated
  from the frequency of each sentencepiece id in the training files (counted here
  with the sentencepiece library on each document), not from byte counts."""
  import collections

  import sentencepiece as spm

  from moejax.data import files
  from moejax.train.loop import build_model

  rng = np.random.default_rng(0)
  words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away"]
  for i in range(11):  # a0 and a9 are held out (every 10th file)
    (tmp_path / f"a{i}.txt").write_text(" ".join(rng.choice(words, 400)), encoding="utf-8")
  config = tiny_l3(str(tmp_path / "tfds"))
  config.data.update(name="files", tokenizer="sentencepiece", vocab_size=300)
  config.data.files.train = str(tmp_path / "*.txt")
  config.model.vocab_size = 300
  config.model.l3.update(corpus="train_split", allocation="frequency", budget=1200, cap=64)
  validate_config(config)

  model = build_model(config)
  (model_file,) = (tmp_path / "tfds" / "moejax_tokenizers").glob("*.model")
  processor = spm.SentencePieceProcessor(model_file=str(model_file))
  counts = collections.Counter()
  for path in files.resolve_files(config.data.files)["train"]:
    counts.update(processor.encode(open(path, encoding="utf-8").read()) + [processor.eos_id()])
  assert len(counts) > 12  # merged pieces, not bytes
  expected = lookup.allocate_rows([counts[t] for t in range(300)], 1200, 64)
  np.testing.assert_array_equal(model.blocks[1].lookup.lengths[...], expected)

  config.model.l3.corpus = "shakespeare"  # byte counts cannot allocate a 300-piece vocabulary
  with pytest.raises(ConfigError, match=r"model\.l3\.allocation='frequency' counts byte tokens"):
    validate_config(config)
