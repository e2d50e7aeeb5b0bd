"""A tiny TFDS dataset with a `domain` feature per document, as the mix corpus has."""

import tensorflow_datasets as tfds

from moejax.data.tfds_compat import LocalGeneratorBasedBuilder

SPLITS = {
  "train": [("drama", "ROMEO: Wherefore art thou?\n" * 20), ("code", "x = [i for i in y]\n" * 20)],
  "validation": [
    ("drama", "JULIET: Good night.\n"),
    ("code", "def f():\n  pass\n"),
    ("drama", "NURSE: Anon!\n"),
  ],
}


class TinyDomains(LocalGeneratorBasedBuilder, skip_registration=True):
  """Few documents per split: 'text' and 'domain'."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      disable_shuffling=True,
      features=(
        tfds.features.FeaturesDict({"text": tfds.features.Text(), "domain": tfds.features.Text()})
      ),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(docs) for split, docs in SPLITS.items()}

  def _generate_examples(self, docs):
    for i, (domain, text) in enumerate(docs):
      yield i, {"text": text, "domain": domain}


def write_tiny_domains(data_dir: str) -> str:
  """Prepares the dataset as array_record under ``data_dir``; returns its name."""
  TinyDomains(data_dir=data_dir, file_format="array_record").download_and_prepare(
    file_format="array_record"
  )
  return TinyDomains.name


def tiny_domains_workdir(root, workdir) -> None:
  """Step 0 of the tiny default MoE trained on this dataset (written to root/tfds)
  in `workdir`: a training workdir whose eval split has domains."""
  from moejax.configs.lm_shakespeare_moe import get_config
  from tests.helpers import training_workdir

  config = get_config("size=tiny")
  data_dir = str(root / "tfds")
  config.data.update(name=write_tiny_domains(data_dir), data_dir=data_dir, batch_size=2)
  training_workdir(str(workdir), config)
