"""``textures``: 16x16 grayscale patches of five images that the scikit-image wheel ships.

Source: files in ``skimage/data`` of the pinned ``scikit-image==0.26.0`` wheel
(requirements.txt), each pinned by sha256 (``TEXTURES``) and read in place (PNG,
lossless; only files inside the wheel, none that skimage would download):

  brick   brick.png   512x512, Bricks25 of CC0Textures, CC0
  grass   grass.png   512x512, "Grass-01" by linolafett (DeviantArt), CC0
  gravel  gravel.png  512x512, Gravel04 of CC0Textures, CC0
  moon    moon.png    512x512, the lunar surface, scikit-image's BSD-3-Clause licence
  cell    cell.png    660x550, a phase image of a cell in saline (Müller et al. 2018), CC0

The class is the source image (``TEXTURES`` order). The top-left 512x512 of each
image is cut into a 16x16 grid of 32x32 regions; from each region ``PATCHES`` = 4
patches of 16x16 are cut at offsets drawn uniformly in [0, 16] per axis by numpy
``default_rng([SEED, class])``, SEED = 0, regions in row-major order.

Examples: ``title`` 'textures/<name>/<region row>_<region col>/<k>' (two digits per
number), ``image`` uint8 [16, 16, 1] (gray levels, 0..255), ``label`` 0..4.

Split rule (``moejax.data.vision_kit``): the unit is a region, all its patches in one
split, so no test pixel is ever in a train patch; per texture, the round(20%) = 51
of the 256 regions with the smallest sha256('textures/<name>/<row>_<col>') are
``test``. Sizes of version 1.0.0: 5,120 patches, 1,024 per texture; train 4,100
and test 1,020 (204 per texture). Split sha256 of version 1.0.0 (the shard files,
the same on every build):

  train  67bac52ce283539b9e7c1b486db887afcfd36e71ae896255327b7dfffc2afb86
  test   22068807b12661949b464c2f2e7dd198226089b554261ac6ba50fc17334bf6b4
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow_datasets as tfds

from moejax.data import vision_kit
from moejax.errors import choice_error

BUILDER_NAME = 'moejax_textures'
IMAGE_SHAPE = (16, 16, 1)
PIXEL_MAX = 255
SCIKIT_IMAGE = 'scikit-image==0.26.0'
REGION = 32  # pixels; the unit of the split
EXTENT = 512  # the top-left EXTENT x EXTENT of each image is cut
PATCHES = 4  # per region
SEED = 0

# name: sha256 of skimage/data/<name>.png
TEXTURES = {
  'brick': '7966caf324f6ba843118d98f7a07746d22f6a343430add0233eca5f6eaaa8fcf',
  'grass': 'b6b6022426b38936c43a4ac09635cd78af074e90f42ffa8227ac8b7452d39f89',
  'gravel': 'c48615b451bf1e606fbd72c0aa9f8cc0f068ab7111ef7d93bb9b0f2586440c12',
  'moon': '78739619d11f7eb9c165bb5d2efd4772cee557812ec847532dbb1d92ef71f577',
  'cell': '8d23a7fb81f7cc877cd09f330357fc7f595651306e84e17252f6e0a1b3f61515',
}
NUM_CLASSES = len(TEXTURES)


@dataclasses.dataclass(frozen=True)
class TextureSource:
  """Which textures, how much of each and how many patches per region; the defaults
  are the dataset's, tests pass less."""

  names: tuple[str, ...] = tuple(TEXTURES)
  extent: int = EXTENT
  patches: int = PATCHES
  seed: int = SEED


def texture_path(name: str) -> str:
  """The verified PNG; ConfigError naming an unknown texture or a missing or altered file."""
  if name not in TEXTURES:
    raise choice_error('textures name', name, TEXTURES)
  return vision_kit.installed_file(
    'skimage', f'data/{name}.png', TEXTURES[name], SCIKIT_IMAGE, 'textures'
  )


def read_texture(path: str) -> np.ndarray:
  """uint8 [H, W] of an 8-bit grayscale PNG; ValueError for any other mode."""
  from PIL import Image  # installed with matplotlib and scikit-image

  with Image.open(path) as image:
    if image.mode != 'L':
      raise ValueError(f'{path} is {image.mode}, not 8-bit grayscale (L)')
    return np.asarray(image, dtype=np.uint8)


def texture_table(source: TextureSource) -> vision_kit.ImageTable:
  """Every patch (see the module doc), in table order."""
  size, regions = IMAGE_SHAPE[0], source.extent // REGION
  titles, images, labels, units = [], [], [], []
  for name in source.names:
    pixels = read_texture(texture_path(name))
    if min(pixels.shape) < source.extent:
      raise ValueError(f'texture {name} is {pixels.shape}, under {source.extent} pixels')
    label = list(TEXTURES).index(name)
    offsets = np.random.default_rng([source.seed, label]).integers(
      0, REGION - size + 1, (regions, regions, source.patches, 2)
    )
    for row in range(regions):
      for col in range(regions):
        unit = f'textures/{name}/{row:02d}_{col:02d}'
        for k, (dy, dx) in enumerate(offsets[row, col].tolist()):
          top, left = row * REGION + dy, col * REGION + dx
          images.append(pixels[top : top + size, left : left + size])
          titles.append(f'{unit}/{k}')
          units.append(unit)
          labels.append(label)
  splits = vision_kit.held_out_splits(units, [titles[i].split('/')[1] for i in range(len(titles))])
  return vision_kit.ImageTable(
    titles, np.stack(images)[..., None], np.asarray(labels, np.int64), splits
  )


class MoejaxTextures(vision_kit.ImageKitBuilder):
  """Texture patches, whole 32x32 regions held out as ``test``."""

  name = BUILDER_NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  IMAGE_SHAPE = IMAGE_SHAPE
  LABELS = tuple(TEXTURES)

  def check_source(self) -> None:
    for name in (self.source or TextureSource()).names:
      texture_path(name)

  def table(self) -> vision_kit.ImageTable:
    return texture_table(self.source or TextureSource())


def prepare_textures(
  data_dir: str | os.PathLike | None = None, source: TextureSource | None = None
) -> tfds.core.DatasetBuilder:
  """Writes the dataset into ``data_dir`` unless already there; returns the builder."""
  return vision_kit.prepare(MoejaxTextures, data_dir, source)
