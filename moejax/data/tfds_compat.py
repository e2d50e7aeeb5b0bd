"""Workarounds for tfds 4.9.10: builders without TF, and byte-identical files.

Deterministic files: under the upb protobuf runtime a ``tf.train.Example``
serializes its feature map in hash-table order, which changes from process to
process, so the same examples gave array_record files with different bytes
(and sha256) on different runs. ``prepare_once`` writes with deterministic
(key-sorted) serialization instead; readers parse either form.

Builders without TF:

``DatasetBuilder.code_path`` evaluates ``importlib_resources.abc.Traversable``
for every builder defined inside a package; tfds only declares the
``importlib_resources`` backport for Python < 3.9, so on 3.11 the lazy import
raises ModuleNotFoundError during ``download_and_prepare``. Subclassing
``LocalGeneratorBasedBuilder`` instead gives the builder its own code path
(the file that defines it), which is all tfds uses it for (finding a
``checksums.tsv`` beside the code).
"""

import contextlib
import inspect
from collections.abc import Callable, Iterator

import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core import example_serializer

from moejax.data.storage import exclusive_lock


class LocalGeneratorBasedBuilder(  # type: ignore[call-arg]  # a tfds metaclass keyword
  tfds.core.GeneratorBasedBuilder, skip_registration=True
):
  """A GeneratorBasedBuilder whose code_path avoids the importlib_resources bug."""

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(inspect.getfile(cls))


def prepare_once(
  make_builder: Callable[[], tfds.core.DatasetBuilder], lock_path: str
) -> tfds.core.DatasetBuilder:
  """Prepares ``make_builder()`` as array_record unless already prepared; returns
  the builder. Idempotent and safe when several processes race: preparation
  runs under a file lock and re-checks ``is_prepared`` once the lock is held."""
  builder = make_builder()
  if not builder.is_prepared():
    with exclusive_lock(lock_path):
      builder = make_builder()
      if not builder.is_prepared():
        with deterministic_serialization():
          builder.download_and_prepare(
            file_format='array_record',
            download_config=tfds.download.DownloadConfig(try_download_gcs=False),
          )
        builder = make_builder()  # Reload so info reflects the files on disk.
  return builder


@contextlib.contextmanager
def deterministic_serialization() -> Iterator[None]:
  """Within the block, tfds serializes examples with sorted map keys (see module doc)."""
  serializer = example_serializer.ExampleSerializer
  original = serializer.serialize_example

  def serialize_example(self, example):
    return self.get_tf_example(example).SerializeToString(deterministic=True)

  serializer.serialize_example = serialize_example
  try:
    yield
  finally:
    serializer.serialize_example = original
