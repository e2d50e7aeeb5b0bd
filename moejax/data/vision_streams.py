"""Continual-learning streams and a few-shot transfer suite over the vision kit's
arrays (``moejax.data.vision_kit.read_split``); pure functions of labels and seeds.

Streams (class-incremental, ``moejax.data.class_stream``):

  Split-MNIST (Zenke et al. 2017)  5 tasks of 2 digits, [0, 1], [2, 3], ..., [8, 9]
  Glyph-62                         62 characters in tasks of 2 (31 tasks; 62 = 2 x 31,
                                   so 1, 2, 31 or 62 per task), natural or seeded order

Few-shot transfer suite (VTAB-1k style, Zhai et al. 2019: 1,000 training examples per
task, evaluated on the whole test split), ``TRANSFER_TASKS``:

  mnist_digits      moejax_mnist     label   10 classes
  glyph_characters  moejax_glyphs    label   62 classes
  glyph_families    moejax_glyphs    family   5 classes (the font family)
  textures          moejax_textures  label    5 classes
  digits_8x8        moejax_digits    label   10 classes, 8x8 upscaled 3x to 24x24

The 1,000 rows are drawn from the train split by ``few_shot_rows``: class-balanced
(class counts differ by at most one), in the order of a seeded permutation.

Pretraining source (``PRETRAINING``): the train split of ``moejax_glyphs``. It is
disjoint in source from mnist_digits, textures and digits_8x8; the two glyph tasks
share its fonts and characters but not its glyphs (whole (font, character) glyphs
are held out in the test split they are evaluated on).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import numpy as np

from moejax.data import vision_digits, vision_glyphs, vision_kit, vision_mnist, vision_textures
from moejax.data.class_stream import class_incremental_tasks, shuffled_class_order, task_rows
from moejax.errors import ConfigError, choice_error

TRAIN_EXAMPLES = 1000
PRETRAINING = ('moejax_glyphs', 'train')
PREPARE = {
  'moejax_digits': vision_digits.prepare_digits,
  'moejax_mnist': vision_mnist.prepare_mnist,
  'moejax_glyphs': vision_glyphs.prepare_glyphs,
  'moejax_textures': vision_textures.prepare_textures,
}
PIXEL_MAX = {
  'moejax_digits': vision_digits.PIXEL_MAX,
  'moejax_mnist': vision_mnist.PIXEL_MAX,
  'moejax_glyphs': vision_glyphs.PIXEL_MAX,
  'moejax_textures': vision_textures.PIXEL_MAX,
}


def split_mnist_tasks() -> list[list[int]]:
  """Split-MNIST's classes per task: [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]."""
  return class_incremental_tasks(list(range(vision_mnist.NUM_CLASSES)), 2)


def split_mnist_rows(labels: np.ndarray) -> list[np.ndarray]:
  """Per Split-MNIST task, the indices of the rows of its two digits, in order."""
  return task_rows(labels, split_mnist_tasks())


def glyph_tasks(classes_per_task: int = 2, seed: int | None = None) -> list[list[int]]:
  """Glyph-62's classes per task: ``CHARACTERS`` order (seed None) or a seeded
  permutation, in groups of ``classes_per_task`` (ConfigError unless it divides 62)."""
  count = vision_glyphs.NUM_CLASSES
  order = list(range(count)) if seed is None else shuffled_class_order(count, seed)
  return class_incremental_tasks(order, classes_per_task, name='glyph class_order')


@dataclasses.dataclass(frozen=True)
class TransferTask:
  """One task of the suite: the builder, the feature that is the class, and the
  nearest-neighbour upscaling of its images."""

  name: str
  dataset: str  # a builder name, a key of PREPARE
  label: str  # 'label', or an extra feature ('family')
  num_classes: int
  upscale: int = 1

  @property
  def disjoint_from_pretraining(self) -> bool:
    return self.dataset != PRETRAINING[0]


TRANSFER_TASKS = (
  TransferTask('mnist_digits', 'moejax_mnist', 'label', vision_mnist.NUM_CLASSES),
  TransferTask('glyph_characters', 'moejax_glyphs', 'label', vision_glyphs.NUM_CLASSES),
  TransferTask('glyph_families', 'moejax_glyphs', 'family', len(vision_glyphs.FAMILIES)),
  TransferTask('textures', 'moejax_textures', 'label', vision_textures.NUM_CLASSES),
  TransferTask('digits_8x8', 'moejax_digits', 'label', vision_digits.NUM_CLASSES, upscale=3),
)


def transfer_task(name: str) -> TransferTask:
  """The suite's task called ``name``; ConfigError naming an unknown one."""
  tasks = {task.name: task for task in TRANSFER_TASKS}
  if name not in tasks:
    raise choice_error('transfer task', name, tasks)
  return tasks[name]


def few_shot_rows(labels: np.ndarray, num_examples: int, seed: int) -> np.ndarray:
  """``num_examples`` distinct row indices, sorted: walking a numpy default_rng(seed)
  permutation of the rows, take each row while its class has fewer than its share
  (num_examples split evenly over the classes present, the remainder going to the
  smallest class labels). ConfigError if the rows cannot give that many."""
  labels = np.asarray(labels)
  classes, available = np.unique(labels, return_counts=True)
  quota = np.full(len(classes), num_examples // max(len(classes), 1))
  quota[: num_examples - quota.sum()] += 1
  if num_examples < 1 or not len(classes) or (quota > available).any():
    raise ConfigError(
      f'num_examples={num_examples} must be >= 1 and at most the rows of every class '
      f'(class sizes {available.tolist()})'
    )
  taken = dict.fromkeys(classes.tolist(), 0)
  budget = dict(zip(classes.tolist(), quota.tolist()))
  chosen = []
  for row in np.random.default_rng(seed).permutation(len(labels)).tolist():
    c = labels[row].item()
    if taken[c] < budget[c]:
      taken[c] += 1
      chosen.append(row)
  return np.sort(np.asarray(chosen, np.int64))


def transfer_split(
  task: TransferTask,
  train: Mapping[str, np.ndarray],
  test: Mapping[str, np.ndarray],
  seed: int = 0,
  num_examples: int = TRAIN_EXAMPLES,
) -> dict[str, np.ndarray]:
  """{'train_images', 'train_labels', 'test_images', 'test_labels'} of ``task`` from
  the builder's split arrays: images float32 [N, H*u, W*u, 1] in [0, 1] (u =
  task.upscale), labels int32 of feature ``task.label``; train is ``few_shot_rows``,
  test the whole split."""
  if task.label not in train:
    raise choice_error(f'transfer task {task.name} label', task.label, train)
  rows = few_shot_rows(train[task.label], num_examples, seed)

  def images(x: np.ndarray) -> np.ndarray:
    scaled = x.astype(np.float32) / PIXEL_MAX[task.dataset]
    return scaled.repeat(task.upscale, axis=1).repeat(task.upscale, axis=2)

  return {
    'train_images': images(train['image'][rows]),
    'train_labels': train[task.label][rows].astype(np.int32),
    'test_images': images(test['image']),
    'test_labels': test[task.label].astype(np.int32),
  }


def load_transfer_task(
  name: str, data_dir: str | os.PathLike | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
  """``transfer_split`` of the task called ``name``, its builder prepared in ``data_dir``."""
  task = transfer_task(name)
  builder = PREPARE[task.dataset](data_dir)
  train, test = (vision_kit.read_split(builder, split) for split in vision_kit.SPLITS)
  return transfer_split(task, train, test, seed)
