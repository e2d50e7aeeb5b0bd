"""A tiny TFDS text dataset written to a temporary dir, standing in for a
user's own dataset: odd split names ('fit', 'heldout'), text under 'body',
non-ASCII text, and no registration, so tfds must find it from its files.

'fit' counts upwards ('3.14é ' is document 3, item 14), so every 16-byte
window of it holds a whole item and no two windows are equal.
"""

import tensorflow_datasets as tfds

from moejax.data.tfds_compat import LocalGeneratorBasedBuilder

SPLIT_TEXTS = {
  'fit': [''.join(f'{i}.{k}\u00e9 ' for k in range(20 + 5 * i)) + '\n' for i in range(10)],
  'heldout': [f'Held-out {i}, \u00fcber \U0001f642\n' * 4 for i in range(3)],
}


class TinyTexts(LocalGeneratorBasedBuilder, skip_registration=True):
  """Few short documents per split, one feature 'body' holding the text."""

  VERSION = tfds.core.Version('1.0.0')

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      features=tfds.features.FeaturesDict({'body': tfds.features.Text()}),
      disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(texts) for split, texts in SPLIT_TEXTS.items()}

  def _generate_examples(self, texts):
    for i, text in enumerate(texts):
      yield i, {'body': text}


def write_tiny_texts(data_dir: str) -> str:
  """Prepares the dataset as array_record under ``data_dir``; returns its name."""
  TinyTexts(data_dir=data_dir, file_format='array_record').download_and_prepare(
    file_format='array_record'
  )
  return TinyTexts.name
