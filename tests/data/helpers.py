"""Helpers shared by the data tests: small configs and batch comparisons."""

import itertools

import ml_collections
import numpy as np


def data_config(data_dir: str, **overrides) -> ml_collections.ConfigDict:
  """The `data` block of moejax.config.base_config, small enough for tests."""
  cfg = dict(
    name='shakespeare',
    tokenizer='byte',
    vocab_size=256,
    seq_len=32,
    batch_size=8,
    data_dir=data_dir,
    text_key='text',
    train_split='train',
    eval_split='validation',
  )
  cfg.update(overrides)
  return ml_collections.ConfigDict(cfg)


def tiny_texts_config(data_dir: str, **overrides) -> ml_collections.ConfigDict:
  """Reads the tiny dataset through the "any TFDS name" path."""
  settings = dict(
    name='tiny_texts',
    text_key='body',
    train_split='fit',
    eval_split='heldout',
    seq_len=15,
    batch_size=4,
  )
  settings.update(overrides)
  return data_config(data_dir, **settings)


def take(iterator, count: int) -> list[dict]:
  return list(itertools.islice(iterator, count))


def assert_batches_equal(actual: list[dict], expected: list[dict]) -> None:
  assert len(actual) == len(expected)
  for got, want in zip(actual, expected):
    assert got.keys() == want.keys()
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
