"""Moving digits (moejax/data/moving_digits.py): the same arguments give the same bytes
(sha256 pinned); every frame is the previous one rolled one step in the label's
direction; the digit is a digit of the named split; the labels are balanced; a bad
split or count is refused naming it."""

import hashlib

import numpy as np
import pytest

from moejax.data import moving_digits as md
from moejax.data import vision_digits
from moejax.errors import ConfigError

PINNED = "819b3ed0fe5cfc1f5a2cc4c3ae41bba6e8c4e61b444e689e7c9d8c79b5e03c9a"  # train, 64, seed 0


def sha256(*arrays) -> str:
  h = hashlib.sha256()
  for a in arrays:
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


def test_the_videos_are_pinned_bytes():
  videos, labels = md.moving_digits("train", 64, seed=0)
  assert videos.shape == (64, 8, 16, 16, 1) and videos.dtype == np.float32
  assert labels.dtype == np.int32
  assert sha256(videos, labels) == PINNED
  assert sha256(*md.moving_digits("train", 64, seed=1)) != PINNED
  assert sha256(*md.moving_digits("test", 64, seed=0)) != PINNED


def test_each_frame_is_the_last_rolled_in_the_labels_direction():
  videos, labels = md.moving_digits("test", 40, seed=3)
  for video, label in zip(videos, labels):
    dy, dx = md.DIRECTIONS[label]
    for t in range(1, md.FRAMES):
      np.testing.assert_array_equal(video[t], np.roll(video[t - 1], (dy, dx), axis=(0, 1)))
    others = [d for d in range(8) if md.DIRECTIONS[d] != (dy, dx)]
    moved = [np.array_equal(video[1], np.roll(video[0], md.DIRECTIONS[d], (0, 1))) for d in others]
    assert not any(moved)  # the direction is identifiable from two frames


def test_the_digit_is_one_of_the_splits_digits():
  images, labels = vision_digits.read_digits(vision_digits.source_path())
  split = np.asarray(vision_digits.split_of_rows(labels))
  test_digits = {images[i, :, :, 0].tobytes() for i in np.flatnonzero(split == "test")}
  videos, _ = md.moving_digits("test", 10, seed=0)
  for video in videos:
    canvas = video[0, :, :, 0]
    found = False
    for r in range(16):
      for c in range(16):
        patch = np.roll(canvas, (-r, -c), axis=(0, 1))[:8, :8] * vision_digits.PIXEL_MAX
        found |= np.rint(patch).astype(np.uint8).tobytes() in test_digits
    assert found


def test_labels_are_balanced():
  _, labels = md.moving_digits("train", 80, seed=0)
  assert np.bincount(labels, minlength=8).tolist() == [10] * 8


@pytest.mark.parametrize(
  ("split", "count", "key"), [("val", 8, "split='val'"), ("test", 0, "count=0")]
)
def test_bad_arguments_are_refused_naming_them(split, count, key):
  with pytest.raises(ConfigError, match=key):
    md.moving_digits(split, count)
