"""The Glyph-62 builder (moejax/data/vision_glyphs.py) on five of its fonts and two
renderings per glyph: the same bytes on two builds, labels and families, whole
(font, character) glyphs held out, and one-line errors for an unknown font, an
altered font file, another FreeType or an unknown split. The full build is an
integration test."""

import numpy as np
import pytest
from matplotlib import ft2font

from moejax.data import mix_sources, vision_glyphs, vision_kit
from moejax.errors import ConfigError
from tests.helpers import documented_split_sha256

FONTS = ('DejaVuSans', 'DejaVuSansMono-Bold', 'DejaVuSerif-Italic', 'STIXGeneral', 'cmr10')
SMALL = vision_glyphs.GlyphSource(fonts=FONTS, variants=2)


@pytest.fixture(scope='module')
def small(tmp_path_factory):
  return vision_glyphs.prepare_glyphs(str(tmp_path_factory.mktemp('glyphs')), SMALL)


def test_two_builds_write_the_same_bytes(small, tmp_path):
  again = vision_glyphs.prepare_glyphs(str(tmp_path), SMALL)
  assert vision_kit.split_sha256(again) == vision_kit.split_sha256(small)


def test_labels_families_and_the_held_out_glyphs(small):
  rows = {split: vision_kit.read_split(small, split) for split in vision_kit.SPLITS}
  assert sum(len(r['label']) for r in rows.values()) == len(FONTS) * 62 * 2
  split_of = {}
  for split, r in rows.items():
    assert r['image'].dtype == np.uint8 and r['image'].shape[1:] == (20, 20, 1)
    assert (r['image'].reshape(len(r['image']), -1).max(1) > 0).all()  # every image has ink
    for title, label, family, font in zip(r['title'], r['label'], r['family'], r['font']):
      _, stem, character, _ = title.split('/')
      assert (stem, vision_glyphs.CHARACTERS[label]) == (font, character)
      assert vision_glyphs.FAMILIES[family] == vision_glyphs.FONTS[font][0]
      assert split_of.setdefault(f'glyphs/{stem}/{character}', split) == split
  strata = {unit: unit.split('/')[2] for unit in split_of}
  held = mix_sources.held_out_titles(strata, 0.2)
  assert {unit for unit, split in split_of.items() if split == 'test'} == held
  assert len(held) == 62  # round(0.2 * 5) = 1 font per character
  assert set(rows['test']['label'].tolist()) == set(range(62))


def test_rendering_is_repeatable_and_seeded():
  table = vision_glyphs.glyph_table(vision_glyphs.GlyphSource(fonts=('cmr10',), variants=3))
  again = vision_glyphs.glyph_table(vision_glyphs.GlyphSource(fonts=('cmr10',), variants=3))
  other = vision_glyphs.glyph_table(vision_glyphs.GlyphSource(('cmr10',), variants=3, seed=1))
  np.testing.assert_array_equal(table.images, again.images)
  assert not np.array_equal(table.images, other.images)
  by_label = table.images.reshape(62, 3, -1).astype(int)
  assert all(np.abs(by_label[a, 0] - by_label[b, 0]).sum() > 0 for a, b in [(0, 1), (36, 10)])


def test_a_glyph_too_large_for_the_canvas_is_refused():
  font = ft2font.FT2Font(vision_glyphs.font_path('DejaVuSans'))
  with pytest.raises(ValueError, match="'W' at 40.0 px/em is .* over the canvas"):
    vision_glyphs.render_glyph(font, 'W', 40.0, (0, 0))


def test_bad_sources_are_refused_in_one_line(monkeypatch, tmp_path):
  with pytest.raises(ConfigError, match=r"glyphs font='Comic' is not known; valid: .*cmr10"):
    vision_glyphs.prepare_glyphs(str(tmp_path), vision_glyphs.GlyphSource(fonts=('Comic',)))
  assert not tmp_path.joinpath('moejax_glyphs').exists()
  monkeypatch.setitem(vision_glyphs.FONTS, 'cmr10', ('computer_modern', '0' * 64))
  with pytest.raises(ConfigError) as error:
    vision_glyphs.font_path('cmr10')
  assert 'cmr10.ttf has sha256' in str(error.value) and 'not the pinned 0000' in str(error.value)
  assert '\n' not in str(error.value)
  monkeypatch.setattr(vision_glyphs, 'FREETYPE_VERSION', '0.0.1')
  with pytest.raises(ConfigError, match='FreeType 0.0.1 of matplotlib==3.11.2, not 2.14.3'):
    vision_glyphs.font_path('DejaVuSans')


def test_an_unknown_split_is_named(small):
  with pytest.raises(ConfigError, match="moejax_glyphs split='val' is not known"):
    vision_kit.read_split(small, 'val')


@pytest.mark.integration
def test_the_full_build_gives_the_documented_splits(tmp_path):
  builds = [vision_glyphs.prepare_glyphs(str(tmp_path / str(i))) for i in range(2)]
  assert vision_kit.split_sha256(builds[0]) == vision_kit.split_sha256(builds[1])
  assert vision_kit.split_sha256(builds[0]) == documented_split_sha256(vision_glyphs.__doc__)
  sizes = {s: builds[0].info.splits[s].num_examples for s in vision_kit.SPLITS}
  assert sizes == {'train': 16864, 'test': 3968}
