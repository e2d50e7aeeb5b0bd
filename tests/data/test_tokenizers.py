"""Tokenizers: lossless round trips, tolerant decoding, the registry, caching."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moejax.data import shakespeare
from moejax.data.tokenizers import (
  SENTENCEPIECE_MIN_VOCAB,
  ByteTokenizer,
  SentencePieceTokenizer,
  get_tokenizer,
)
from moejax.errors import ConfigError


@given(st.text())
def test_byte_tokenizer_round_trips_any_text(text):
  tokenizer = ByteTokenizer()
  ids = tokenizer.encode(text)
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, list(text.encode('utf-8')))
  assert tokenizer.decode(ids) == text


def test_byte_decode_replaces_invalid_utf8_and_rejects_non_bytes():
  tokenizer = ByteTokenizer()
  assert tokenizer.decode([0xFF, ord('A'), 0xE2, 0x98]) == '\ufffdA\ufffd'
  with pytest.raises(ValueError, match='byte ids must be in'):
    tokenizer.decode([65, 256])


def test_unknown_tokenizer_lists_valid_names():
  with pytest.raises(
    ConfigError, match=r"data.tokenizer='wordpiece' is not known; valid: byte, sentencepiece"
  ):
    get_tokenizer('wordpiece')


@pytest.fixture(scope='module')
def corpus():
  texts = {t.play: t.path.read_text() for t in shakespeare.list_source_texts()}
  return {'train': [texts['macbeth'], texts['sonnets']], 'heldout': texts['hamlet']}


def test_sentencepiece_is_lossless_and_cached(corpus, tmp_path):
  model_path = str(tmp_path / 'spm.model')
  trained = get_tokenizer(
    'sentencepiece', vocab_size=512, model_path=model_path, train_texts=lambda: corpus['train']
  )
  assert trained.vocab_size == 512
  text = corpus['heldout'][:5000] + '\n  two  spaces, caf\u00e9 \U0001f642\n'
  ids = trained.encode(text)
  assert ids.dtype == np.int32 and len(ids) < len(text)
  assert trained.decode(ids) == text

  def must_not_train():
    raise AssertionError('the cached model should have been loaded')

  cached = get_tokenizer(
    'sentencepiece', vocab_size=512, model_path=model_path, train_texts=must_not_train
  )
  np.testing.assert_array_equal(cached.encode(text), ids)


@pytest.mark.parametrize('vocab_size', [None, 100, SENTENCEPIECE_MIN_VOCAB - 1])
def test_sentencepiece_vocab_below_minimum_is_rejected_upfront(vocab_size):
  with pytest.raises(ConfigError, match=rf'data.vocab_size={vocab_size} must be an int >= '):
    get_tokenizer(
      'sentencepiece',
      vocab_size=vocab_size,
      model_path='unused',
      train_texts=lambda: pytest.fail('must not train'),
    )


def test_sentencepiece_vocab_too_small_for_corpus_names_the_key(corpus):
  with pytest.raises(ConfigError, match=r'data.vocab_size=300 does not suit sentencepiece'):
    SentencePieceTokenizer.train(corpus['train'], vocab_size=300)
