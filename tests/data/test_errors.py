"""Bad settings fail early with a ConfigError naming the key and the value."""

import os

import pytest

from moejax.data import build_lm_data
from moejax.errors import ConfigError

from .helpers import data_config, tiny_texts_config


@pytest.mark.parametrize(
  'overrides, shards, message',
  [
    (
      dict(tokenizer='wordpiece'),
      1,
      r"data.tokenizer='wordpiece' is not known; valid: byte, sentencepiece",
    ),
    (dict(seq_len=0), 1, r'data.seq_len=0 must be an int >= 1'),
    (dict(batch_size=0), 1, r'data.batch_size=0 must be an int >= 1'),
    (dict(batch_size=6), 4, r'data.batch_size=6 must be divisible by shard_count=4'),
    (
      dict(tokenizer='sentencepiece', vocab_size=256),
      1,
      r'data.vocab_size=256 must be an int >= 260',
    ),
    (
      dict(name='no_such_dataset'),
      1,
      r"data.name='no_such_dataset' is not a known dataset .*built-in names: shakespeare",
    ),
    (dict(name='mnist'), 1, r"data.name='mnist' is a TFDS builder but is not prepared"),
  ],
)
def test_bad_settings_fail_before_any_data_is_written(tmp_path, overrides, shards, message):
  data_dir = tmp_path / 'untouched'
  with pytest.raises(ConfigError, match=message):
    build_lm_data(data_config(str(data_dir), **overrides), seed=0, shard_count=shards)
  assert not data_dir.exists() or not os.listdir(data_dir)


def test_bad_seed_and_shard_index(tmp_path):
  cfg = data_config(str(tmp_path))
  with pytest.raises(ConfigError, match=r'seed=-1 must be an int in \[0, 2\*\*32\)'):
    build_lm_data(cfg, seed=-1)
  with pytest.raises(ConfigError, match=r'shard_index=2 must be in \[0, shard_count=2\)'):
    build_lm_data(cfg, seed=0, shard_index=2, shard_count=2)


@pytest.mark.parametrize(
  'key, value', [('text_key', 'content'), ('train_split', 'train'), ('eval_split', 'test')]
)
def test_keys_missing_from_the_dataset_are_named(tiny_dir, key, value):
  with pytest.raises(ConfigError, match=rf"data.{key}='{value}' is not a (split|feature)"):
    build_lm_data(tiny_texts_config(tiny_dir, **{key: value}), seed=0)


def test_corpus_too_small_for_one_batch(tiny_dir):
  with pytest.raises(
    ConfigError,
    match=r"data.eval_split='heldout' of data.name='tiny_texts' "
    r'is too small: 1 windows of data.seq_len\+1=256 tokens, fewer than one '
    r'batch of data.batch_size=4',
  ):
    build_lm_data(tiny_texts_config(tiny_dir, seq_len=255), seed=0)
