"""build_lm_data: batch layout, order, exact resume, sharding, eval, bpb ratio."""

import json
import os

import numpy as np
import pytest

from moejax.data import build_lm_data, shakespeare
from moejax.data.packing import pack_documents
from moejax.errors import ConfigError

from .helpers import assert_batches_equal, data_config, take, tiny_texts_config
from .tiny_texts import SPLIT_TEXTS


def window_rows(batches):
  """Each row's full seq_len + 1 window: inputs plus the last target."""
  return np.concatenate([np.concatenate([b['inputs'], b['targets'][:, -1:]], 1) for b in batches])


def test_train_batches_are_shifted_int32_pairs(shakespeare_dir):
  data = build_lm_data(data_config(shakespeare_dir), seed=0)
  for batch in take(data.train_iter, 3):
    assert set(batch) == {'inputs', 'targets'}
    for array in batch.values():
      assert isinstance(array, np.ndarray) and array.dtype == np.int32 and array.shape == (8, 32)
    np.testing.assert_array_equal(batch['targets'][:, :-1], batch['inputs'][:, 1:])
  assert data.vocab_size == 256 and data.bytes_per_token == 1.0


def test_eval_batches_walk_the_validation_stream_in_order(shakespeare_dir):
  data = build_lm_data(data_config(shakespeare_dir), seed=0)
  source = shakespeare.shakespeare_sources(shakespeare_dir)['validation']
  texts = [source[i]['text'].decode() for i in range(len(source))]
  stream = pack_documents(map(data.tokenizer.encode, texts), data.tokenizer.eos_id)
  rows = window_rows(data.eval_batches()).reshape(-1)
  assert data.num_eval_batches == len(stream) // (33 * 8)
  np.testing.assert_array_equal(rows, stream[: len(rows)])


@pytest.mark.parametrize('dataset', ['shakespeare', 'tiny'])
def test_resume_from_saved_state_is_exact(dataset, shakespeare_dir, tiny_dir):
  # Tiny: 45 windows = 11 batches per epoch, so batches 5..12 cross an epoch.
  cfg = (
    data_config(shakespeare_dir)
    if dataset == 'shakespeare'
    else tiny_texts_config(tiny_dir, seq_len=63, batch_size=4)
  )
  original = build_lm_data(cfg, seed=7).train_iter
  take(original, 5)
  state = json.loads(json.dumps(original.get_state()))
  expected = take(original, 8)

  resumed = build_lm_data(cfg, seed=7).train_iter
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 8), expected)


def test_seed_alone_decides_the_order(shakespeare_dir):
  cfg = data_config(shakespeare_dir)
  first = take(build_lm_data(cfg, seed=1).train_iter, 3)
  assert_batches_equal(take(build_lm_data(cfg, seed=1).train_iter, 3), first)
  other = take(build_lm_data(cfg, seed=2).train_iter, 3)
  assert not np.array_equal(other[0]['inputs'], first[0]['inputs'])


def test_each_epoch_is_a_fresh_permutation_of_all_windows(tiny_dir):
  cfg = tiny_texts_config(tiny_dir, seq_len=15, batch_size=1)
  data = build_lm_data(cfg, seed=3)
  num_windows = len(pack_documents(map(data.tokenizer.encode, SPLIT_TEXTS['fit']), 0)) // 16
  epochs = window_rows(take(data.train_iter, 2 * num_windows)).reshape(2, num_windows, 16)
  for epoch in epochs:
    assert len({row.tobytes() for row in epoch}) == num_windows
  assert {r.tobytes() for r in epochs[0]} == {r.tobytes() for r in epochs[1]}
  assert not np.array_equal(epochs[0], epochs[1])


def test_shards_are_disjoint_halves_of_the_global_batch(shakespeare_dir):
  cfg = data_config(shakespeare_dir, batch_size=8)
  whole = build_lm_data(cfg, seed=5)
  shards = [build_lm_data(cfg, seed=5, shard_index=i, shard_count=2) for i in range(2)]
  global_batches = take(whole.train_iter, 3)
  shard_batches = [take(shard.train_iter, 3) for shard in shards]
  for step, global_batch in enumerate(global_batches):
    halves = [batches[step] for batches in shard_batches]
    assert halves[0]['inputs'].shape == (4, 32)
    assert not {r.tobytes() for r in halves[0]['inputs']} & {
      r.tobytes() for r in halves[1]['inputs']
    }
    for key in global_batch:  # Documented order: shard 0's rows, then shard 1's.
      np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), global_batch[key])
  for step, global_batch in enumerate(whole.eval_batches(2)):
    halves = [list(shard.eval_batches(2))[step] for shard in shards]
    np.testing.assert_array_equal(
      np.concatenate([h['inputs'] for h in halves]), global_batch['inputs']
    )


def test_eval_batches_are_the_same_on_every_call(shakespeare_dir):
  data = build_lm_data(data_config(shakespeare_dir), seed=0)
  first = list(data.eval_batches(4))
  assert len(first) == 4
  assert_batches_equal(list(data.eval_batches(4)), first)
  assert_batches_equal(
    list(build_lm_data(data_config(shakespeare_dir), seed=9).eval_batches(4)), first
  )
  assert len(list(data.eval_batches(None))) == data.num_eval_batches
  with pytest.raises(ConfigError, match=rf'eval_batches={data.num_eval_batches + 1} must be in'):
    data.eval_batches(data.num_eval_batches + 1)


def test_sentencepiece_pipeline_caches_its_model(shakespeare_dir):
  cfg = data_config(shakespeare_dir, tokenizer='sentencepiece', vocab_size=512, seq_len=64)
  data = build_lm_data(cfg, seed=0)
  assert data.vocab_size == 512
  batch = next(data.train_iter)
  assert batch['inputs'].shape == (8, 64) and batch['inputs'].max() < 512
  source = shakespeare.shakespeare_sources(shakespeare_dir)['validation']
  texts = [source[i]['text'].decode() for i in range(len(source))]
  num_bytes = sum(len(t.encode()) for t in texts) + len(texts)
  num_tokens = sum(len(data.tokenizer.encode(t)) for t in texts) + len(texts)
  assert data.bytes_per_token == pytest.approx(num_bytes / num_tokens)
  assert data.bytes_per_token > 1.5
  models = os.listdir(os.path.join(shakespeare_dir, 'moejax_tokenizers'))
  assert 'moejax_shakespeare-modern-1.0.0-train-text-sentencepiece512.model' in models
