"""The held-out documents of a dataset, with and without a `domain` feature."""
import ml_collections

from moejax.data.pipeline import split_documents
from tests.data.tiny_texts import SPLIT_TEXTS, write_tiny_texts
from tests.evaluation.domain_texts import SPLITS, write_tiny_domains


def test_domain_feature_and_dataset_name(tmp_path):
  name = write_tiny_domains(str(tmp_path))
  cfg = ml_collections.ConfigDict({"name": name, "data_dir": str(tmp_path)})
  assert split_documents(cfg) == SPLITS["validation"]
  assert split_documents(cfg, "train_split") == SPLITS["train"]
  name = write_tiny_texts(str(tmp_path))
  cfg = ml_collections.ConfigDict({"name": name, "data_dir": str(tmp_path), "text_key": "body",
                                   "eval_split": "heldout"})
  assert split_documents(cfg) == [(name, text) for text in SPLIT_TEXTS["heldout"]]
