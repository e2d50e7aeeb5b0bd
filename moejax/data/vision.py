"""Image classification batches from a built-in TFDS image dataset, with grain and no
TensorFlow: what the train loop reads for ``task='classification'``.

``build_image_data(cfg, seed=..., shard_index=..., shard_count=...)`` reads the
``data`` config block (``moejax.config.base_config``): ``name`` (one of
``VISION_DATASETS``), ``train_split``, ``eval_split``, ``batch_size``, ``data_dir``.

Batches are {'inputs': float32 [B/S, H, W, C], pixels scaled to [0, 1] by the
dataset's ``pixel_max``; 'targets': int32 [B/S] class labels}, so the train step
feeds them to the model and its cross-entropy as it does token batches
(moejax/train/step.py). A split is small and held in memory.

Train order: the examples shuffled with ``seed`` (a fresh permutation every epoch)
and repeated forever; global batch t holds positions [t*B, (t+1)*B) of that order,
process s its rows [s*B/S, (s+1)*B/S), as for token batches
(``moejax.data.pipeline``); ``train_iter`` resumes exactly from ``get_state()``.

Eval: the eval split in order, in global batches of B; the last one is padded
with copies of the first example, and eval batches carry 'weights' float32
[B/S], 1 for a real example and 0 for padding, so an evaluation over every
batch counts each held-out image exactly once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Sequence

import grain
import numpy as np

from moejax.data import vision_digits, vision_glyphs, vision_mnist, vision_textures
from moejax.data.pipeline import READ_OPTIONS, Batch, _batched
from moejax.data.storage import resolve_data_dir
from moejax.errors import ConfigError, choice_error


@dataclasses.dataclass(frozen=True)
class VisionDataset:
  """A built-in image dataset: its builder and what a model must match."""

  prepare: Callable  # data_dir -> the prepared tfds builder
  image_shape: tuple[int, int, int]  # H, W, C
  num_classes: int
  pixel_max: int  # the largest pixel value: inputs are pixels / pixel_max


VISION_DATASETS = {
  'digits': VisionDataset(
    vision_digits.prepare_digits,
    vision_digits.IMAGE_SHAPE,
    vision_digits.NUM_CLASSES,
    vision_digits.PIXEL_MAX,
  ),
  'mnist': VisionDataset(
    vision_mnist.prepare_mnist,
    vision_mnist.IMAGE_SHAPE,
    vision_mnist.NUM_CLASSES,
    vision_mnist.PIXEL_MAX,
  ),
  'glyphs': VisionDataset(
    vision_glyphs.prepare_glyphs,
    vision_glyphs.IMAGE_SHAPE,
    vision_glyphs.NUM_CLASSES,
    vision_glyphs.PIXEL_MAX,
  ),
  'textures': VisionDataset(
    vision_textures.prepare_textures,
    vision_textures.IMAGE_SHAPE,
    vision_textures.NUM_CLASSES,
    vision_textures.PIXEL_MAX,
  ),
}


@dataclasses.dataclass(frozen=True)
class ImageData:
  """What the train loop needs from an image dataset (see the module doc).

  eval_batches: ``eval_batches(num_batches=None)`` -> the first
    min(num_batches, num_eval_batches) eval batches (None: all), the same on
    every call; all of them hold every example of the eval split once.
  """

  train_iter: grain.DatasetIterator
  eval_batches: Callable[[int | None], Iterator[Batch]]
  num_classes: int
  num_eval_batches: int
  num_eval_examples: int


class ExampleSource(Sequence):
  """Random access to {'inputs', 'targets'[, 'weights']} of in-memory arrays; rows past
  the data (eval padding) repeat row 0 with weight 0."""

  def __init__(
    self, images: np.ndarray, labels: np.ndarray, length: int | None = None, weighted: bool = False
  ):
    self.images, self.labels = images, labels
    self.length = len(labels) if length is None else length
    self.weighted = weighted

  def __len__(self) -> int:
    return self.length

  def __getitem__(self, index: int) -> Batch:  # type: ignore[override]  # grain reads by int
    real = index < len(self.labels)
    row = index if real else 0
    example = {'inputs': self.images[row], 'targets': self.labels[row]}
    if self.weighted:
      example['weights'] = np.float32(real)
    return example


def check_data_settings(cfg) -> VisionDataset:
  """The dataset of data.name; ConfigError naming the key for a bad name or batch size."""
  if cfg.name not in VISION_DATASETS:
    raise choice_error('data.name', cfg.name, VISION_DATASETS)
  batch = cfg.batch_size
  if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
    raise ConfigError(f'data.batch_size={batch!r} must be an int >= 1')
  return VISION_DATASETS[cfg.name]


def read_split(builder, cfg, key: str, pixel_max: int) -> tuple[np.ndarray, np.ndarray]:
  """(images float32 [N, H, W, C] in [0, 1], labels int32 [N]) of the split ``cfg[key]``."""
  split = cfg[key]
  if split not in builder.info.splits:
    raise ConfigError(
      f'data.{key}={split!r} is not a split of data.name={cfg.name!r}; '
      f"splits: {', '.join(builder.info.splits)}"
    )
  source = builder.as_data_source(split)
  records = [source[i] for i in range(len(source))]
  images = np.stack([r['image'] for r in records]).astype(np.float32) / pixel_max
  return images, np.asarray([r['label'] for r in records], np.int32)


def build_image_data(cfg, *, seed: int, shard_index: int = 0, shard_count: int = 1) -> ImageData:
  """Train and eval image batches for this process (see the module doc)."""
  dataset = check_data_settings(cfg)
  if cfg.batch_size % shard_count:
    raise ConfigError(
      f'data.batch_size={cfg.batch_size} must be divisible by '
      f'shard_count={shard_count} (each process takes an equal slice)'
    )
  builder = dataset.prepare(resolve_data_dir(cfg.get('data_dir')))
  train = read_split(builder, cfg, 'train_split', dataset.pixel_max)
  test = read_split(builder, cfg, 'eval_split', dataset.pixel_max)
  if len(train[1]) < cfg.batch_size:
    raise ConfigError(
      f'data.train_split={cfg.train_split!r} of data.name={cfg.name!r} has '
      f'{len(train[1])} examples, fewer than data.batch_size={cfg.batch_size}'
    )
  rows = cfg.batch_size // shard_count
  train_ds = grain.MapDataset.source(ExampleSource(*train)).shuffle(seed=seed).repeat()
  num_eval_batches = math.ceil(len(test[1]) / cfg.batch_size)
  eval_ds = _batched(
    grain.MapDataset.source(ExampleSource(*test, num_eval_batches * cfg.batch_size, weighted=True)),
    rows,
    shard_index,
    shard_count,
  )
  return ImageData(
    train_iter=iter(
      _batched(train_ds, rows, shard_index, shard_count).to_iter_dataset(READ_OPTIONS)
    ),
    eval_batches=functools.partial(_eval_batches, eval_ds, num_eval_batches),
    num_classes=dataset.num_classes,
    num_eval_batches=num_eval_batches,
    num_eval_examples=len(test[1]),
  )


def _eval_batches(
  eval_ds: grain.MapDataset, num_available: int, num_batches: int | None = None
) -> Iterator[Batch]:
  count = num_available if num_batches is None else min(num_batches, num_available)
  return (eval_ds[i] for i in range(count))
