"""``glyphs``: Glyph-62, the characters 0-9 A-Z a-z rendered from matplotlib's fonts.

Source: 21 TrueType fonts in ``mpl-data/fonts/ttf`` of the pinned ``matplotlib==3.11.2``
wheel (requirements.txt), each pinned by sha256 (``FONTS``), rendered by the FreeType
2.14.3 that the wheel builds in (``matplotlib.ft2font``; another FreeType is refused,
as it may rasterise differently). Five families, the domain feature ``family``:

  dejavu_sans       DejaVuSans, -Bold, -Oblique, -BoldOblique
  dejavu_sans_mono  DejaVuSansMono, -Bold, -Oblique, -BoldOblique
  dejavu_serif      DejaVuSerif, -Bold, -Italic, -BoldItalic
  stix              STIXGeneral, STIXGeneralBol, STIXGeneralItalic, STIXGeneralBolIta
  computer_modern   cmr10, cmss10, cmtt10, cmb10, cmti10

Licences: DejaVu, the Bitstream Vera font licence (and the Arev fonts' public-domain
changes; mpl-data/fonts/ttf/LICENSE_DEJAVU); STIX, the SIL Open Font License 1.1
(LICENSE_STIX); the cm fonts, the BaKoMa TrueType conversion of Knuth's Computer
Modern (free to use and redistribute unmodified, as matplotlib ships them).

Rendering (``render_glyph``): antialiased, unhinted, FreeType's bitmap placed on a 20x20
canvas with its baseline on row 15 and centred across; each (font, character) is drawn
``VARIANTS`` = 16 times with a size drawn uniformly in [12, 15] pixels per em and a
shift in [-2, 2] pixels each way (clipped to keep the ink inside), drawn from
numpy ``default_rng([SEED, font index, label])``, SEED = 0.

Examples: ``title`` 'glyphs/<font>/<character>/%02d' % variant, ``image`` uint8
[20, 20, 1] (coverage, 0..255), ``label`` 0..61 (``CHARACTERS`` order), ``family``
0..4 (``FAMILIES``), ``font`` the file's stem. Table order: fonts as listed, then
characters, then variants.

Split rule (``moejax.data.vision_kit``): the unit is a (font, character) pair, all
of its renderings in one split; for each character, the round(20%) = 4 of its 21
fonts with the smallest sha256('glyphs/<font>/<character>') are ``test``, so a test
glyph's shape is never seen in training. Sizes of version 1.0.0: 20,832 images,
336 per character (16 per font); train 16,864 and test 3,968 (64 per character).
Split sha256 of version 1.0.0 (the shard files, the same on every build):

  train  6f65065ccd7c30895ec3859eea031d930da6c2b68ceb9ab2bf1d9a3bd77d8108
  test   fd34c2207210cde966f50797af87f101f83671c2a11dbd0e8596b290a0cd5b50
"""

from __future__ import annotations

import dataclasses
import os
import string

import numpy as np
import tensorflow_datasets as tfds

from moejax.data import vision_kit
from moejax.errors import ConfigError, choice_error

BUILDER_NAME = 'moejax_glyphs'
IMAGE_SHAPE = (20, 20, 1)
CHARACTERS = string.digits + string.ascii_uppercase + string.ascii_lowercase
NUM_CLASSES = len(CHARACTERS)
PIXEL_MAX = 255
FAMILIES = ('dejavu_sans', 'dejavu_sans_mono', 'dejavu_serif', 'stix', 'computer_modern')
MATPLOTLIB = 'matplotlib==3.11.2'
FREETYPE_VERSION = '2.14.3'
VARIANTS = 16
SEED = 0
BASELINE_ROW = 15
SIZE_RANGE = (12.0, 15.0)  # pixels per em
MAX_SHIFT = 2

# font file stem: (family, sha256 of mpl-data/fonts/ttf/<stem>.ttf)
FONTS = {
  'DejaVuSans': ('dejavu_sans', '3fdf69cabf06049ea70a00b5919340e2ce1e6d02b0cc3c4b44fb6801bd1e0d22'),
  'DejaVuSans-Bold': (
    'dejavu_sans',
    'b184b89e3c1075f22f6b71575b6fc20d4972b3cfd3b23322ca6fd596dcaef167',
  ),
  'DejaVuSans-Oblique': (
    'dejavu_sans',
    'ccdf74b350f11fd3dd5774de50e5e6346a1a5da1f5b7d5fb83590665e97a5213',
  ),
  'DejaVuSans-BoldOblique': (
    'dejavu_sans',
    '6edf0283160186af451cbee71e7b845f2e4cabf264bb992ce668c83c25465e6f',
  ),
  'DejaVuSansMono': (
    'dejavu_sans_mono',
    '602ec86b8948cfcd956482fe64f94c36c867770149ef2f791d4613f443bcecb3',
  ),
  'DejaVuSansMono-Bold': (
    'dejavu_sans_mono',
    'baada9a5172fe20886251aff0433fc38461912d5daf07287e7bee56620a8da96',
  ),
  'DejaVuSansMono-Oblique': (
    'dejavu_sans_mono',
    '28052813f7a709fc89f52d192dc995ef4f0fdc5c3d7b73a49d6849b1916d0cd0',
  ),
  'DejaVuSansMono-BoldOblique': (
    'dejavu_sans_mono',
    'a69081c15c76c827e0a27a5a7f5c74b6135c843499955495ffa8c20d3a98288b',
  ),
  'DejaVuSerif': (
    'dejavu_serif',
    '107244956e9962b9e96faccdc551825e0ae0898ae13737133e1b921a2fd35ffa',
  ),
  'DejaVuSerif-Bold': (
    'dejavu_serif',
    'c3753f2ed6bc673f15846dc45addbeb3b9c872f32fb18fd53a21f1bef1ed7676',
  ),
  'DejaVuSerif-Italic': (
    'dejavu_serif',
    '3e7994fbc54fa10ce3352a42d548fadd7d9cadb69cb1109bc9d960f6dac57f04',
  ),
  'DejaVuSerif-BoldItalic': (
    'dejavu_serif',
    'd93efec7a9d2e826768d1a2ee95b95870e15e29599a84f3484af1de1cec2e181',
  ),
  'STIXGeneral': ('stix', '167378031e2dddc6216d67819c9260e9a06ffc4c478e4e23cb98a6fd44b183c2'),
  'STIXGeneralBol': ('stix', 'e8533dc7083fa346bda1933d60ea4a83b67d0945bceaf1b3541f82b4a0e2c6a0'),
  'STIXGeneralItalic': (
    'stix',
    '6cfcb333d22b7c3c623bdfd40174f14c85c3d6731ca6166c1edc80140eae8527',
  ),
  'STIXGeneralBolIta': (
    'stix',
    '98788fd4ba48dfbb2bd026c0e20a247a8b06c7372879628b7a6bb0d5bb09736c',
  ),
  'cmr10': ('computer_modern', '4dd9761b058c009db9b2145f55ee6617d093c273dd3d6c5b3e43ff6110fa9bf6'),
  'cmss10': ('computer_modern', '7df91a83d05b2e471ec638cb0b435a360a3c792b09fc42a7da67e91f2e79115a'),
  'cmtt10': ('computer_modern', '6211f09ae93599991afda970c24669dad1a77e253d915624fbf212f702f071d7'),
  'cmb10': ('computer_modern', '074497b50c43ea57597181591f9893d38fc12a87e95104f5657fc2481f61a23a'),
  'cmti10': ('computer_modern', 'f9f1f9f654308ae82f7be4441ae89b080896b34cc220bbea173c5e9adcfe3ef7'),
}


@dataclasses.dataclass(frozen=True)
class GlyphSource:
  """Which fonts (stems of ``FONTS``) and how many renderings of each glyph; the
  defaults are the dataset's, tests pass fewer."""

  fonts: tuple[str, ...] = tuple(FONTS)
  variants: int = VARIANTS
  seed: int = SEED


def font_path(stem: str) -> str:
  """The verified font file; ConfigError naming an unknown font, a missing or altered
  file, or a FreeType other than the pinned one."""
  if stem not in FONTS:
    raise choice_error('glyphs font', stem, FONTS)
  from matplotlib import ft2font

  if ft2font.__freetype_version__ != FREETYPE_VERSION:
    raise ConfigError(
      f'data.name=glyphs renders with the FreeType {FREETYPE_VERSION} of {MATPLOTLIB}, '
      f'not {ft2font.__freetype_version__}; run `{vision_kit.SETUP_COMMAND}`'
    )
  relative = f'mpl-data/fonts/ttf/{stem}.ttf'
  return vision_kit.installed_file('matplotlib', relative, FONTS[stem][1], MATPLOTLIB, 'glyphs')


def render_glyph(font, character: str, size: float, shift: tuple[int, int]) -> np.ndarray:
  """uint8 [20, 20]: ``character`` of the ft2font ``font`` at ``size`` pixels per em,
  baseline on BASELINE_ROW, ink centred across, moved by ``shift`` (rows, columns)
  as far as the ink stays inside. ValueError if the ink cannot fit."""
  from matplotlib import ft2font

  font.set_size(size, 72)  # 72 dpi: points are pixels
  font.set_text(character, 0.0, flags=ft2font.LoadFlags.NO_HINTING)
  font.draw_glyphs_to_bitmap(antialiased=True)
  ink = np.asarray(font.get_image())
  height, width = ink.shape
  canvas_h, canvas_w = IMAGE_SHAPE[:2]
  if height > canvas_h or width > canvas_w:
    raise ValueError(f'{character!r} at {size} px/em is {height}x{width}, over the canvas')
  top = BASELINE_ROW - (height - round(font.get_descent() / 64)) + shift[0]
  left = (canvas_w - width) // 2 + shift[1]
  top, left = min(max(top, 0), canvas_h - height), min(max(left, 0), canvas_w - width)
  canvas = np.zeros((canvas_h, canvas_w), np.uint8)
  canvas[top : top + height, left : left + width] = ink
  return canvas


def glyph_table(source: GlyphSource) -> vision_kit.ImageTable:
  """Every rendering (see the module doc), in table order."""
  from matplotlib import ft2font

  titles, images, labels, families, fonts, units = [], [], [], [], [], []
  for stem in source.fonts:
    font = ft2font.FT2Font(font_path(stem))
    index = list(FONTS).index(stem)
    for label, character in enumerate(CHARACTERS):
      rng = np.random.default_rng([source.seed, index, label])
      sizes = rng.uniform(*SIZE_RANGE, source.variants)
      shifts = rng.integers(-MAX_SHIFT, MAX_SHIFT + 1, (source.variants, 2))
      for variant in range(source.variants):
        images.append(render_glyph(font, character, float(sizes[variant]), tuple(shifts[variant])))
        titles.append(f'glyphs/{stem}/{character}/{variant:02d}')
        units.append(f'glyphs/{stem}/{character}')
        labels.append(label)
        families.append(FAMILIES.index(FONTS[stem][0]))
        fonts.append(stem)
  splits = vision_kit.held_out_splits(units, [CHARACTERS[c] for c in labels])
  return vision_kit.ImageTable(
    titles,
    np.stack(images)[..., None],
    np.asarray(labels, np.int64),
    splits,
    {'family': families, 'font': fonts},
  )


class MoejaxGlyphs(vision_kit.ImageKitBuilder):
  """Glyph-62: 62 characters in 21 fonts, whole (font, character) glyphs held out."""

  name = BUILDER_NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  IMAGE_SHAPE = IMAGE_SHAPE
  LABELS = tuple(CHARACTERS)
  EXTRA_FEATURES = {
    'family': tfds.features.ClassLabel(names=list(FAMILIES)),
    'font': tfds.features.Text(),
  }

  def check_source(self) -> None:
    for stem in (self.source or GlyphSource()).fonts:
      font_path(stem)

  def table(self) -> vision_kit.ImageTable:
    return glyph_table(self.source or GlyphSource())


def prepare_glyphs(
  data_dir: str | os.PathLike | None = None, source: GlyphSource | None = None
) -> tfds.core.DatasetBuilder:
  """Writes the dataset into ``data_dir`` unless already there; returns the builder."""
  return vision_kit.prepare(MoejaxGlyphs, data_dir, source)
