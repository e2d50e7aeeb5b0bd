"""The digits builder (moejax/data/vision_digits.py) and its batches (moejax/data/vision.py):
the same bytes on two builds, scikit-learn's own images and labels, the known class
counts, a stratified split that never repeats an image, and every test image seen
once by an evaluation."""

import collections
import hashlib

import numpy as np
import pytest
from ml_collections import ConfigDict

from moejax.data import vision, vision_digits
from moejax.errors import ConfigError

# sklearn.datasets.load_digits, per class 0..9 (the UCI test set's counts).
CLASS_COUNTS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory) -> str:
  data_dir = str(tmp_path_factory.mktemp("digits"))
  vision_digits.prepare_digits(data_dir)
  return data_dir


def split_files_sha256(builder) -> dict[str, str]:
  digests = {}
  for split in vision_digits.SPLITS:
    digest = hashlib.sha256()
    for path in builder.info.splits[split].filepaths:
      digest.update(path.read_bytes())
    digests[split] = digest.hexdigest()
  return digests


def records(builder, split):
  source = builder.as_data_source(split)
  return [source[i] for i in range(len(source))]


def test_two_builds_write_the_same_bytes(digits_dir, tmp_path):
  first = vision_digits.prepare_digits(digits_dir)
  second = vision_digits.prepare_digits(str(tmp_path))
  assert split_files_sha256(first) == split_files_sha256(second)


def test_the_examples_are_sklearns_digits_with_the_known_class_counts(digits_dir):
  from sklearn.datasets import load_digits

  digits = load_digits()
  builder = vision_digits.prepare_digits(digits_dir)
  seen = {}
  for split in vision_digits.SPLITS:
    for r in records(builder, split):
      seen[int(r["title"].decode().split("/")[1])] = (r["image"], r["label"], split)
  assert sorted(seen) == list(range(1797))
  images = np.stack([seen[i][0] for i in range(1797)])
  np.testing.assert_array_equal(images[..., 0], digits.images.astype(np.uint8))
  labels = np.asarray([seen[i][1] for i in range(1797)])
  np.testing.assert_array_equal(labels, digits.target)
  assert np.bincount(labels).tolist() == CLASS_COUNTS
  test = collections.Counter(int(label) for _, label, split in seen.values() if split == "test")
  assert [test[c] for c in range(10)] == [round(0.2 * n) for n in CLASS_COUNTS]
  assert len(builder.info.splits["train"].filepaths) == 1
  assert (builder.info.splits["train"].num_examples, builder.info.splits["test"].num_examples) == (
    1438,
    359,
  )


def test_the_split_is_fixed_by_the_titles_not_the_row_order():
  labels = np.arange(50) % 5
  splits = vision_digits.split_of_rows(labels)
  assert splits.count("test") == 10
  assert splits == vision_digits.split_of_rows(labels.copy())
  assert vision_digits.split_of_rows(labels[:10]) != ["train"] * 10


def test_an_altered_source_file_is_refused(monkeypatch):
  monkeypatch.setattr(vision_digits, "SOURCE_SHA256", "0" * 64)
  with pytest.raises(ConfigError, match="not the pinned 0000"):
    vision_digits.source_path()


def data_cfg(digits_dir, **changes):
  cfg = ConfigDict(
    dict(name="digits", train_split="train", eval_split="test", batch_size=64, data_dir=digits_dir)
  )
  cfg.update(changes)
  return cfg


def test_eval_batches_hold_every_test_image_once(digits_dir):
  data = vision.build_image_data(data_cfg(digits_dir), seed=0)
  batches = list(data.eval_batches())
  assert data.num_eval_batches == len(batches) == 6 and data.num_eval_examples == 359
  weights = np.concatenate([b["weights"] for b in batches])
  assert weights.sum() == 359 and weights[:359].all() and not weights[359:].any()
  images = np.concatenate([b["inputs"] for b in batches])[:359]
  assert images.dtype == np.float32 and images.shape == (359, 8, 8, 1)
  assert 0 <= images.min() and images.max() == 1.0
  assert list(data.eval_batches(2))[1]["targets"].tolist() == batches[1]["targets"].tolist()


def test_train_batches_are_shards_of_one_global_order_and_resume(digits_dir):
  whole = vision.build_image_data(data_cfg(digits_dir), seed=3)
  first = [next(whole.train_iter) for _ in range(3)]
  assert first[0]["inputs"].shape == (64, 8, 8, 1) and first[0]["targets"].dtype == np.int32
  shards = [
    vision.build_image_data(data_cfg(digits_dir), seed=3, shard_index=s, shard_count=2)
    for s in range(2)
  ]
  rows = [next(shard.train_iter)["targets"] for shard in shards]
  np.testing.assert_array_equal(np.concatenate(rows), first[0]["targets"])
  resumed = vision.build_image_data(data_cfg(digits_dir), seed=3)
  next(resumed.train_iter)
  state = resumed.train_iter.get_state()
  again = vision.build_image_data(data_cfg(digits_dir), seed=3)
  again.train_iter.set_state(state)
  np.testing.assert_array_equal(next(again.train_iter)["inputs"], first[1]["inputs"])


@pytest.mark.parametrize(
  "changes, names",
  [
    (dict(name="cifar"), ["data.name='cifar'", "digits"]),
    (dict(eval_split="validation"), ["data.eval_split='validation'", "test"]),
    (dict(batch_size=0), ["data.batch_size=0"]),
    (dict(batch_size=2000), ["data.batch_size=2000", "1438"]),
  ],
)
def test_bad_settings_are_refused_by_name(digits_dir, changes, names):
  with pytest.raises(ConfigError) as error:
    vision.build_image_data(data_cfg(digits_dir, **changes), seed=0)
  assert "\n" not in str(error.value)
  for name in names:
    assert name in str(error.value)
