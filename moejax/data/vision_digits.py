"""``digits``: scikit-learn's bundled 8x8 handwritten digits as an offline TFDS dataset.

The source is the file ``sklearn/datasets/data/digits.csv.gz`` of the pinned
``scikit-learn==1.6.1`` wheel (requirements.txt), the UCI optical recognition of
handwritten digits test set (Alpaydin & Kaynak 1998) that ``load_digits`` reads:
1,797 images of 8x8 pixels, each pixel a count in 0..16 of the set pixels of a
4x4 block of a 32x32 bitmap, and a label 0..9. The file is pinned by its sha256
(``SOURCE_SHA256``) and read in place; nothing is downloaded.

Examples (row i of the file): ``title`` 'digits/%04d' % i, ``image`` uint8
[8, 8, 1] (the counts, 0..16: ``PIXEL_MAX``), ``label`` 0..9.

Split rule (``moejax.data.mix_sources.held_out_titles``, as the mix corpus holds out
documents): within each class, the round(20%) of titles with the smallest
sha256(title) go to ``test``, the rest to ``train``. Deterministic and independent
of file order. Sizes of version 1.0.0: train 1,438 and test 359 images; class
counts over both splits 178, 182, 177, 183, 181, 182, 181, 179, 174, 180.
Examples are in row order in each split, and the array_record files are the
same bytes on every build (``moejax.data.tfds_compat.prepare_once``;
tests/vision/test_digits.py). Split sha256 of version 1.0.0 (the shard files):

  train  3e7def8be99c4c0e617c000c91808fae34b826a7fe3fb3570353c1f7f68e9d33
  test   ff15f00ee89f0d1ac7779474822468cbe6dbd31b0436069607417377000735f6
"""

from __future__ import annotations

import gzip
import importlib.resources
import io
import os
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from moejax.data.mix_sources import held_out_titles, sha256_file
from moejax.data.storage import resolve_data_dir
from moejax.data.tfds_compat import LocalGeneratorBasedBuilder, prepare_once
from moejax.errors import ConfigError

BUILDER_NAME = 'moejax_digits'
SPLITS = ('train', 'test')
IMAGE_SHAPE = (8, 8, 1)
NUM_CLASSES = 10
PIXEL_MAX = 16
TEST_FRACTION = 0.2
SOURCE_PACKAGE = 'scikit-learn==1.6.1'
SOURCE_SHA256 = '09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22'


def source_path() -> str:
  """The installed digits.csv.gz; ConfigError if sklearn is missing or the file altered."""
  try:
    path = str(importlib.resources.files('sklearn.datasets') / 'data' / 'digits.csv.gz')
  except ModuleNotFoundError:
    raise ConfigError(
      f'data.name=digits reads the digits file of {SOURCE_PACKAGE}, which is '
      'not installed: run `bash scripts/setup.sh`'
    ) from None
  digest = sha256_file(path)
  if digest != SOURCE_SHA256:
    raise ConfigError(
      f'data.name=digits: {path} has sha256 {digest}, not the pinned '
      f'{SOURCE_SHA256} of {SOURCE_PACKAGE}; run `bash scripts/setup.sh`'
    )
  return path


def read_digits(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [N, 8, 8, 1], labels int64 [N]) of the csv.gz at ``path``: 64 pixel
  counts then the label on each line."""
  with gzip.open(path, 'rb') as f:
    table = np.loadtxt(io.BytesIO(f.read()), delimiter=',', dtype=np.int64)
  return table[:, :-1].astype(np.uint8).reshape(-1, *IMAGE_SHAPE), table[:, -1]


def split_of_rows(labels: np.ndarray) -> list[str]:
  """The split of every row (see the module doc)."""
  titles = [f'digits/{i:04d}' for i in range(len(labels))]
  held = held_out_titles(dict(zip(titles, map(str, labels))), TEST_FRACTION)
  return ['test' if title in held else 'train' for title in titles]


class MoejaxDigits(LocalGeneratorBasedBuilder):
  """The digits, one example per image, 20% of each class held out as ``test``."""

  name = BUILDER_NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {
          'title': tfds.features.Text(),
          'image': tfds.features.Tensor(shape=IMAGE_SHAPE, dtype=np.uint8),
          'label': tfds.features.ClassLabel(num_classes=NUM_CLASSES),
        }
      ),
      supervised_keys=('image', 'label'),
      disable_shuffling=True,  # Keep the row order.
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    images, labels = read_digits(source_path())
    splits = split_of_rows(labels)
    return {
      split: self._generate_examples(
        images, labels, [i for i, s in enumerate(splits) if s == split]
      )
      for split in SPLITS
    }

  def _generate_examples(self, images, labels, rows) -> Iterator[tuple[str, dict]]:
    for i in rows:
      title = f'digits/{i:04d}'
      yield title, {'title': title, 'image': images[i], 'label': int(labels[i])}


def prepare_digits(data_dir: str | os.PathLike | None = None) -> tfds.core.DatasetBuilder:
  """Writes the dataset into ``data_dir`` unless already there; returns the builder."""
  data_dir = resolve_data_dir(data_dir)
  return prepare_once(
    lambda: MoejaxDigits(data_dir=data_dir, file_format='array_record'),
    os.path.join(data_dir, f'{BUILDER_NAME}.lock'),
  )
