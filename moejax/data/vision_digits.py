"""``digits``: scikit-learn's bundled 8x8 handwritten digits as an offline TFDS dataset.

The source is the file ``sklearn/datasets/data/digits.csv.gz`` of the pinned
``scikit-learn==1.6.1`` wheel (requirements.txt), the UCI optical recognition of
handwritten digits test set (Alpaydin & Kaynak 1998) that ``load_digits`` reads:
1,797 images of 8x8 pixels, each pixel a count in 0..16 of the set pixels of a
4x4 block of a 32x32 bitmap, and a label 0..9. The file is pinned by its sha256
(``SOURCE_SHA256``) and read in place; nothing is downloaded.

Examples (row i of the file): ``title`` 'digits/%04d' % i, ``image`` uint8
[8, 8, 1] (the counts, 0..16: ``PIXEL_MAX``), ``label`` 0..9.

Split rule (``moejax.data.vision_kit``: the mix corpus's ``held_out_titles``):
within each class, the round(20%) of titles with the smallest sha256(title) go to
``test``, the rest to ``train``. Deterministic and independent
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
import io
import os

import numpy as np
import tensorflow_datasets as tfds

from moejax.data import vision_kit

BUILDER_NAME = 'moejax_digits'
SPLITS = vision_kit.SPLITS
IMAGE_SHAPE = (8, 8, 1)
NUM_CLASSES = 10
PIXEL_MAX = 16
TEST_FRACTION = vision_kit.TEST_FRACTION
SOURCE_PACKAGE = 'scikit-learn==1.6.1'
SOURCE_SHA256 = '09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22'


def source_path() -> str:
  """The installed digits.csv.gz; ConfigError if sklearn is missing or the file altered."""
  return vision_kit.installed_file(
    'sklearn.datasets', 'data/digits.csv.gz', SOURCE_SHA256, SOURCE_PACKAGE, 'digits'
  )


def read_digits(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [N, 8, 8, 1], labels int64 [N]) of the csv.gz at ``path``: 64 pixel
  counts then the label on each line."""
  with gzip.open(path, 'rb') as f:
    table = np.loadtxt(io.BytesIO(f.read()), delimiter=',', dtype=np.int64)
  return table[:, :-1].astype(np.uint8).reshape(-1, *IMAGE_SHAPE), table[:, -1]


def titles_of_rows(count: int) -> list[str]:
  return [f'digits/{i:04d}' for i in range(count)]


def split_of_rows(labels: np.ndarray) -> list[str]:
  """The split of every row (see the module doc)."""
  return vision_kit.held_out_splits(titles_of_rows(len(labels)), [str(c) for c in labels])


class MoejaxDigits(vision_kit.ImageKitBuilder):
  """The digits, one example per image, 20% of each class held out as ``test``."""

  name = BUILDER_NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  IMAGE_SHAPE = IMAGE_SHAPE
  LABELS = NUM_CLASSES

  def check_source(self) -> None:
    source_path()

  def table(self) -> vision_kit.ImageTable:
    images, labels = read_digits(source_path())
    return vision_kit.ImageTable(titles_of_rows(len(labels)), images, labels, split_of_rows(labels))


def prepare_digits(data_dir: str | os.PathLike | None = None) -> tfds.core.DatasetBuilder:
  """Writes the dataset into ``data_dir`` unless already there; returns the builder."""
  return vision_kit.prepare(MoejaxDigits, data_dir)
