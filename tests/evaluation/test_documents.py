"""The held-out documents of a dataset, with and without a `domain` feature."""

import ml_collections
import pytest

from moejax.errors import ConfigError

from moejax.data.pipeline import split_documents
from tests.data.tiny_texts import SPLIT_TEXTS, write_tiny_texts
from tests.evaluation.domain_texts import SPLITS, write_tiny_domains


def test_domain_feature_and_dataset_name(tmp_path):
  name = write_tiny_domains(str(tmp_path))
  cfg = ml_collections.ConfigDict({"name": name, "data_dir": str(tmp_path)})
  assert split_documents(cfg) == SPLITS["validation"]
  assert split_documents(cfg, "train_split") == SPLITS["train"]
  name = write_tiny_texts(str(tmp_path))
  cfg = ml_collections.ConfigDict(
    {"name": name, "data_dir": str(tmp_path), "text_key": "body", "eval_split": "heldout"}
  )
  assert split_documents(cfg) == [(name, text) for text in SPLIT_TEXTS["heldout"]]


def test_sample_documents_takes_the_first_bytes_of_each_domain():
  from moejax.evaluation.harness import sample_documents

  docs = [("a", "0123"), ("b", "xy"), ("a", "4567"), ("a", "89"), ("b", "zzzzzz")]
  # a: "0123" whole (4 <= 6), then "45" of "4567" fills 6; "89" is past the budget.
  # b: "xy" whole, then "zzzz" of the next fills 6.
  assert sample_documents(docs, 6) == [("a", "0123"), ("b", "xy"), ("a", "45"), ("b", "zzzz")]
  assert sample_documents(docs, 0) == docs
  assert sample_documents(docs, 100) == docs
  # a cut inside a multi-byte character drops that character (3 of 4 bytes: "é" is 2)
  assert sample_documents([("u", "aéb"), ("u", "c")], 2) == [("u", "a")]
  assert sample_documents([("u", "aéb"), ("u", "c")], 3) == [("u", "aé")]
  with pytest.raises(ConfigError, match=r"bytes_per_domain=-1 must be >= 0"):
    sample_documents(docs, -1)
