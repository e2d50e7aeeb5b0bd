"""data.name=files: the user's own .txt/.jsonl files, streamed from disk."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from moejax.config import base_config
from moejax.validation import validate_config
from moejax.data import build_lm_data, files
from moejax.data.packing import PackedWindows, pack_documents
from moejax.data.tokenizers import ByteTokenizer, SentencePieceTokenizer
from moejax.errors import ConfigError

from .helpers import assert_batches_equal, data_config, take

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORDS = ['the', 'cat', 'sat', 'on', 'a', 'mat', 'héllo', 'wörld', '\n', 'dog', 'ran']


def write_corpus(root, num_txt=3, num_lines=20) -> list[str]:
  """a0.txt ... and b.jsonl (one blank line) under ``root``; their documents in order."""
  rng = np.random.default_rng(0)
  docs = []
  for i in range(num_txt):
    docs.append(' '.join(rng.choice(WORDS, 300)))
    (root / f'a{i}.txt').write_text(docs[-1], encoding='utf-8')
  lines = [' '.join(rng.choice(WORDS, n)) for n in rng.integers(0, 40, num_lines)]
  records = [json.dumps({'id': i, 'text': line}) for i, line in enumerate(lines)]
  (root / 'b.jsonl').write_text('\n'.join(records[:5] + [''] + records[5:]) + '\n')
  return docs + lines


def files_config(root, train='*', eval_glob=None):
  return data_config(
    str(root / 'never_created'),
    name='files',
    seq_len=15,
    batch_size=4,
    files=dict(train=str(root / train), eval=eval_glob and str(root / eval_glob)),
  )


@pytest.mark.parametrize('tokenizer', ['byte', 'sentencepiece'])
def test_streamed_windows_equal_the_in_memory_packing(tmp_path, monkeypatch, tokenizer):
  docs = write_corpus(tmp_path)
  tok = ByteTokenizer() if tokenizer == 'byte' else SentencePieceTokenizer.train(docs, 300)
  monkeypatch.setattr(files, 'PIECE_BYTES', 64)  # many .txt pieces per document
  streamed = files.StreamedWindows(sorted(map(str, tmp_path.iterdir())), tok, 15)
  packed = PackedWindows(pack_documents(map(tok.encode, docs), tok.eos_id), 15)
  assert len(streamed) == len(packed) > 100
  for i in range(len(packed)):
    np.testing.assert_array_equal(streamed.window(i), packed.window(i))
  assert list(streamed.texts()) == docs


def test_every_tenth_file_is_held_out_whole_and_never_trained_on(tmp_path):
  write_corpus(tmp_path, num_txt=11)
  cfg = files_config(tmp_path)
  paths = files.resolve_files(cfg.files)
  assert [p.rsplit('/', 1)[1] for p in paths['eval']] == ['a0.txt', 'a9.txt']
  assert not set(paths['eval']) & set(paths['train'])
  data = build_lm_data(cfg, seed=0)
  held_out = b'\0'.join((tmp_path / n).read_bytes() for n in ('a0.txt', 'a9.txt')) + b'\0'
  row = next(data.eval_batches(1))['inputs'][0]
  assert row.astype(np.uint8).tobytes() in held_out
  train = '\0'.join(files.StreamedWindows(paths['train'], ByteTokenizer(), 1).texts()) + '\0'
  for batch in take(data.train_iter, 3):
    for row in batch['inputs']:
      assert row.astype(np.uint8).tobytes() in train.encode()
  assert data.bytes_per_token == 1.0 and not (tmp_path / 'never_created').exists()


def test_streamed_training_resumes_bit_exactly(tmp_path):
  write_corpus(tmp_path)
  cfg = files_config(tmp_path, '*.txt', 'b.jsonl')
  uninterrupted = take(build_lm_data(cfg, seed=5).train_iter, 60)  # > 1 epoch (~48 batches)
  first = build_lm_data(cfg, seed=5).train_iter
  take(first, 7)
  state = first.get_state()
  resumed = build_lm_data(cfg, seed=5).train_iter
  resumed.set_state(json.loads(json.dumps(state)))
  assert_batches_equal(take(resumed, 53), uninterrupted[7:])
  other_seed = take(build_lm_data(cfg, seed=6).train_iter, 60)
  assert any(
    not np.array_equal(a['inputs'], b['inputs']) for a, b in zip(other_seed, uninterrupted)
  )


@pytest.mark.parametrize(
  'train, eval_glob, message',
  [
    ('*.md', None, r"^data\.files\.train='.*/\*\.md' matches no file$"),
    ('*', 'none/*.txt', r"^data\.files\.eval='.*' matches no file$"),
    ('bad.jsonl', 'a0.txt', r"^data\.text_key='text' is not a key of line .*/bad\.jsonl:2$"),
    ('a0.txt', None, r"^data\.files\.train='.*' matches 1 file and data\.files\.eval is unset"),
    ('*', 'a0.txt', r"^data\.files\.eval='.*' and data\.files\.train='.*' both match"),
    ('**', None, r"matches '.*', which is not a \.txt or \.jsonl file$"),
  ],
)
def test_bad_files_are_refused_in_one_line_before_anything_is_written(
  tmp_path, train, eval_glob, message
):
  write_corpus(tmp_path)
  (tmp_path / 'bad.jsonl').write_text('{"text": "ok"}\n{"body": "no text key"}\n')
  cfg = files_config(tmp_path, train, eval_glob)
  with pytest.raises(ConfigError, match=message) as error:
    build_lm_data(cfg, seed=0)
  assert '\n' not in str(error.value)
  assert not (tmp_path / 'never_created').exists()
  if 'text_key' not in message:  # the glob checks run in validate_config too
    config = base_config()
    config.data.name = 'files'
    config.data.files.train, config.data.files.eval = cfg.files.train, cfg.files.eval
    with pytest.raises(ConfigError, match=message):
      validate_config(config)


MEMORY_PROBE = textwrap.dedent('''
    import resource, sys, threading
    import ml_collections
    # Address space, not memory, is what RLIMIT_AS limits: each new thread reserves
    # its stack (8 MiB by default), and a few of grain's reader threads would use
    # up the headroom before a byte is read. Likewise glibc gives a thread that finds
    # the malloc lock taken an arena of its own, reserving 64 MiB: the caller sets
    # MALLOC_ARENA_MAX=1 (with 2, a loaded machine failed to start a reader thread).
    threading.stack_size(1 << 20)
    from moejax.data import build_lm_data
    root, corpus_mb, headroom_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    vm_size = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status')
                   if l.startswith('VmSize'))
    limit = vm_size + (headroom_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
      open(root + '/big.txt', 'rb').read()
      sys.exit('the limit does not bite: the whole corpus fits in memory')
    except MemoryError:
      pass
    cfg = ml_collections.ConfigDict(dict(
        name='files', files=dict(train=root + '/big.txt', eval=root + '/small.txt'),
        seq_len=16383, batch_size=8, tokenizer='byte', data_dir=root + '/unused'))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data = build_lm_data(cfg, seed=0)
    batches = (corpus_mb << 20) // (16384 * 8)  # one epoch: every window once
    total = sum(int(next(data.train_iter)['inputs'].sum() > 0) for _ in range(batches))
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    print(f'batches={total} peak_rss_growth_mb={grown:.1f}')
''')


@pytest.mark.integration
def test_a_corpus_larger_than_the_memory_limit_streams_with_bounded_memory(tmp_path):
  corpus_mb, headroom_mb = 128, 64
  block = np.random.default_rng(0).integers(32, 127, 1 << 20, dtype=np.uint8).tobytes()
  with open(tmp_path / 'big.txt', 'wb') as f:
    for _ in range(corpus_mb):
      f.write(block)
  (tmp_path / 'small.txt').write_bytes(block[:300_000])
  result = subprocess.run(
    [sys.executable, '-c', MEMORY_PROBE, str(tmp_path), str(corpus_mb), str(headroom_mb)],
    capture_output=True,
    text=True,
    timeout=120,
    cwd=ROOT,
    env={**os.environ, 'MALLOC_ARENA_MAX': '1', 'JAX_PLATFORMS': 'cpu'},
  )
  assert result.returncode == 0, result.stderr[-2000:]
  stats = dict(item.split('=') for item in result.stdout.split())
  assert int(stats['batches']) == corpus_mb * 8
  assert float(stats['peak_rss_growth_mb']) < 32
