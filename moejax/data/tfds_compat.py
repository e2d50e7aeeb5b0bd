"""Workaround for a tfds 4.9.10 bug that breaks dataset builders without TF.

``DatasetBuilder.code_path`` evaluates ``importlib_resources.abc.Traversable``
for every builder defined inside a package; tfds only declares the
``importlib_resources`` backport for Python < 3.9, so on 3.11 the lazy import
raises ModuleNotFoundError during ``download_and_prepare``. Subclassing
``LocalGeneratorBasedBuilder`` instead gives the builder its own code path
(the file that defines it), which is all tfds uses it for (finding a
``checksums.tsv`` beside the code).
"""

import inspect
from collections.abc import Callable

import tensorflow_datasets as tfds
from etils import epath

from moejax.data.storage import exclusive_lock


class LocalGeneratorBasedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A GeneratorBasedBuilder whose code_path avoids the importlib_resources bug."""

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(inspect.getfile(cls))


def prepare_once(make_builder: Callable[[], tfds.core.DatasetBuilder],
                 lock_path: str) -> tfds.core.DatasetBuilder:
  """Prepares ``make_builder()`` as array_record unless already prepared; returns
  the builder. Idempotent and safe when several processes race: preparation
  runs under a file lock and re-checks ``is_prepared`` once the lock is held."""
  builder = make_builder()
  if not builder.is_prepared():
    with exclusive_lock(lock_path):
      builder = make_builder()
      if not builder.is_prepared():
        builder.download_and_prepare(
            file_format='array_record',
            download_config=tfds.download.DownloadConfig(try_download_gcs=False))
        builder = make_builder()  # Reload so info reflects the files on disk.
  return builder
