"""The TFDS builders a config names (data.name, data.data_dir): the built-in ones
(prepared on first use), or any TFDS dataset prepared as array_record; and a split of
one as a random-access source, with data.train_split/eval_split and data.text_key
checked against the builder's info. A bad name, split or key is a ConfigError naming it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import tensorflow_datasets as tfds

from moejax.data import mix, shakespeare
from moejax.errors import ConfigError

# Built-in dataset name -> prepare(data_dir) of its builder.
BUILTIN_DATASETS: dict[str, Callable[[str], tfds.core.DatasetBuilder]] = {
  'shakespeare': functools.partial(shakespeare.prepare_shakespeare, config='modern'),
  'shakespeare_folio': functools.partial(
    shakespeare.prepare_shakespeare, config='modern_and_folio'
  ),
  'mix': mix.prepare_mix,
}


def open_builder(name: str, data_dir: str) -> tfds.core.DatasetBuilder:
  """The prepared, array_record-backed builder for ``data.name``."""
  if name in BUILTIN_DATASETS:
    return BUILTIN_DATASETS[name](data_dir)
  hint = (
    f"built-in names: {', '.join(BUILTIN_DATASETS)}, files; any TFDS dataset name also "
    f"works once prepared with file_format='array_record' in data.data_dir"
  )
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ConfigError(
      f'data.name={name!r} is not a known dataset in data.data_dir={data_dir!r} ({hint})'
    ) from None
  if not builder.is_prepared():
    raise ConfigError(
      f'data.name={name!r} is a TFDS builder but is not prepared in '
      f'data.data_dir={data_dir!r} ({hint})'
    )
  formats = {builder.info.file_format, *builder.info.alternative_file_formats}
  if tfds.core.FileFormat.ARRAY_RECORD not in formats:
    raise ConfigError(
      f'data.name={name!r} in data.data_dir={data_dir!r} is stored as '
      f'{builder.info.file_format.value}, but reading without TensorFlow '
      f"needs file_format='array_record'; prepare it again with that"
    )
  return builder


def open_split(builder, settings: dict, key: str) -> Sequence[dict]:
  """A random-access source for the split named by ``settings[key]``."""
  split, text_key = settings[key], settings['text_key']
  if split.split('[')[0] not in builder.info.splits:  # 'train[:90%]' slices are fine.
    raise ConfigError(
      f'data.{key}={split!r} is not a split of data.name='
      f"{settings['name']!r}; splits: {', '.join(builder.info.splits)}"
    )
  if text_key not in builder.info.features:
    raise ConfigError(
      f'data.text_key={text_key!r} is not a feature of data.name='
      f"{settings['name']!r}; features: {', '.join(builder.info.features)}"
    )
  return builder.as_data_source(split, file_format=tfds.core.FileFormat.ARRAY_RECORD)
