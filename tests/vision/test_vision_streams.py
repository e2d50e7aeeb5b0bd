"""Streams and the transfer suite over the vision kit (moejax/data/vision_streams.py):
tasks partition the classes and rows, few-shot draws are balanced, distinct and
seeded, and a task's arrays come from the feature it names."""

import numpy as np
import pytest

from moejax.data import vision_streams
from moejax.errors import ConfigError


def test_split_mnist_is_five_disjoint_pairs_that_cover_every_row():
  tasks = vision_streams.split_mnist_tasks()
  assert tasks == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
  labels = np.random.default_rng(0).integers(0, 10, 500)
  rows = vision_streams.split_mnist_rows(labels)
  assert sorted(np.concatenate(rows).tolist()) == list(range(500))
  for classes, task_rows in zip(tasks, rows):
    assert set(labels[task_rows].tolist()) == set(classes)


def test_glyph_tasks_partition_the_62_characters():
  natural = vision_streams.glyph_tasks()
  assert len(natural) == 31 and natural[0] == [0, 1] and natural[-1] == [60, 61]
  seeded = vision_streams.glyph_tasks(seed=3)
  assert sorted(c for task in seeded for c in task) == list(range(62))
  assert seeded != natural and seeded == vision_streams.glyph_tasks(seed=3)
  assert len(vision_streams.glyph_tasks(31)) == 2
  with pytest.raises(ConfigError, match='classes_per_task=4 must be >= 1 and divide the 62'):
    vision_streams.glyph_tasks(4)


def test_few_shot_rows_are_distinct_balanced_and_seeded():
  labels = np.random.default_rng(1).integers(0, 7, 3000)
  rows = vision_streams.few_shot_rows(labels, 1000, seed=0)
  assert len(rows) == len(set(rows.tolist())) == 1000
  assert np.bincount(labels[rows]).tolist() == [143] * 6 + [142]
  np.testing.assert_array_equal(rows, vision_streams.few_shot_rows(labels, 1000, seed=0))
  assert not np.array_equal(rows, vision_streams.few_shot_rows(labels, 1000, seed=1))
  with pytest.raises(ConfigError, match=r'num_examples=2000 must be .* \(class sizes \['):
    vision_streams.few_shot_rows(labels[:1500], 2000, seed=0)


def test_the_suite_names_five_tasks_and_the_pretraining_overlap():
  tasks = vision_streams.TRANSFER_TASKS
  assert [t.name for t in tasks] == [
    'mnist_digits',
    'glyph_characters',
    'glyph_families',
    'textures',
    'digits_8x8',
  ]
  assert {t.dataset for t in tasks} == set(vision_streams.PREPARE)
  disjoint = [t.name for t in tasks if t.disjoint_from_pretraining]
  assert disjoint == ['mnist_digits', 'textures', 'digits_8x8']
  with pytest.raises(ConfigError, match="transfer task='cifar' is not known; valid: digits_8x8"):
    vision_streams.transfer_task('cifar')


def test_a_task_takes_its_labels_from_the_feature_it_names():
  rng = np.random.default_rng(2)
  split = {
    'image': rng.integers(0, 256, (1200, 20, 20, 1), dtype=np.uint8),
    'label': rng.integers(0, 62, 1200),
    'family': rng.integers(0, 5, 1200),
  }
  task = vision_streams.transfer_task('glyph_families')
  out = vision_streams.transfer_split(task, split, split, seed=0)
  assert out['train_images'].shape == (1000, 20, 20, 1) and out['train_images'].dtype == np.float32
  assert out['train_images'].max() <= 1.0 and np.bincount(out['train_labels']).tolist() == [200] * 5
  np.testing.assert_array_equal(out['test_labels'], split['family'])
  digits = vision_streams.transfer_task('digits_8x8')
  small = {'image': np.arange(64, dtype=np.uint8).reshape(1, 8, 8, 1) % 17, 'label': np.zeros(1)}
  scaled = vision_streams.transfer_split(digits, small, small, num_examples=1)['test_images']
  assert scaled.shape == (1, 24, 24, 1) and scaled[0, 3, 3, 0] == small['image'][0, 1, 1, 0] / 16
  with pytest.raises(ConfigError, match="label='family' is not known"):
    vision_streams.transfer_split(task, small, small)


def test_the_textures_task_loads_from_its_builder(tmp_path):
  out = vision_streams.load_transfer_task('textures', str(tmp_path), seed=0)
  assert out['train_images'].shape == (1000, 16, 16, 1) and len(out['test_labels']) == 1020
  assert np.bincount(out['train_labels']).tolist() == [200] * 5
