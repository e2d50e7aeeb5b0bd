"""The textures builder (moejax/data/vision_textures.py): the documented bytes on two
full builds, patches cut from inside their region of the pinned image, whole
regions held out, and one-line errors for an unknown texture, an altered file or an
unknown split."""

import numpy as np
import pytest

from moejax.data import mix_sources, vision_kit, vision_textures
from moejax.errors import ConfigError
from tests.helpers import documented_split_sha256


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  return vision_textures.prepare_textures(str(tmp_path_factory.mktemp('textures')))


def test_two_builds_write_the_documented_bytes(built, tmp_path):
  again = vision_textures.prepare_textures(str(tmp_path))
  assert vision_kit.split_sha256(again) == vision_kit.split_sha256(built)
  assert vision_kit.split_sha256(built) == documented_split_sha256(vision_textures.__doc__)
  test = vision_kit.read_split(built, 'test')
  assert test['image'].dtype == np.uint8 and test['image'].shape == (1020, 16, 16, 1)
  assert np.bincount(test['label']).tolist() == [204] * 5
  assert built.info.splits['train'].num_examples == 4100


def test_each_patch_lies_inside_its_region_of_the_source_image():
  source = vision_textures.TextureSource(names=('brick', 'moon'), extent=64, patches=3)
  table = vision_textures.texture_table(source)
  assert len(table.titles) == 2 * 4 * 3
  for title, image, label in zip(table.titles, table.images, table.labels):
    _, name, region, _ = title.split('/')
    assert list(vision_textures.TEXTURES)[label] == name
    pixels = vision_textures.read_texture(vision_textures.texture_path(name))
    row, col = (int(x) * 32 for x in region.split('_'))
    block = pixels[row : row + 32, col : col + 32]
    windows = np.lib.stride_tricks.sliding_window_view(block, (16, 16))
    assert (windows == image[..., 0]).all(axis=(2, 3)).any(), title


def test_whole_regions_are_held_out_by_the_rule():
  table = vision_textures.texture_table(vision_textures.TextureSource(names=('grass',)))
  split_of = {}
  for title, split in zip(table.titles, table.splits):
    assert split_of.setdefault(title.rsplit('/', 1)[0], split) == split
  held = mix_sources.held_out_titles(dict.fromkeys(split_of, 'grass'), 0.2)
  assert {unit for unit, split in split_of.items() if split == 'test'} == held
  assert len(held) == 51 and len(split_of) == 256


def test_bad_sources_are_refused_in_one_line(monkeypatch, tmp_path):
  source = vision_textures.TextureSource(names=('brick', 'marble'))
  with pytest.raises(ConfigError, match=r"textures name='marble' is not known; valid: .*gravel"):
    vision_textures.prepare_textures(str(tmp_path), source)
  assert not tmp_path.joinpath('moejax_textures').exists()
  monkeypatch.setitem(vision_textures.TEXTURES, 'moon', '0' * 64)
  with pytest.raises(ConfigError) as error:
    vision_textures.texture_path('moon')
  assert 'moon.png has sha256' in str(error.value) and 'not the pinned 0000' in str(error.value)
  assert '\n' not in str(error.value)


def test_a_colour_image_is_refused():
  path = vision_textures.texture_path('brick').replace('brick.png', 'astronaut.png')
  with pytest.raises(ValueError, match='astronaut.png is RGB, not 8-bit grayscale'):
    vision_textures.read_texture(path)


def test_an_unknown_split_is_named(built):
  with pytest.raises(ConfigError, match="moejax_textures split='validation' is not known"):
    vision_kit.read_split(built, 'validation')
