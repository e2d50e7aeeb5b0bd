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

import tensorflow_datasets as tfds
from etils import epath


class LocalGeneratorBasedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A GeneratorBasedBuilder whose code_path avoids the importlib_resources bug."""

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(inspect.getfile(cls))
