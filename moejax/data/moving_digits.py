"""Moving digits: short videos whose class is a motion no single frame reveals.

Each video is FRAMES = 8 frames of CANVAS x CANVAS = 16 x 16 pixels (one channel, in
[0, 1]): one scikit-learn 8x8 digit (moejax/data/vision_digits.py, the pinned file and
its train/test split) pasted at a start position and moved by one pixel per frame in
one of the 8 compass directions (DIRECTIONS, (row, col) steps), wrapping around the
canvas edges (a torus). The label is the direction index 0..7; the digit's identity is
a nuisance.

Why no single frame reveals the class: frame t shows the digit at start + t * step
(mod 16), and the start is uniform over the 16 x 16 cells, independent of the
direction, so every frame's position is uniform whatever the class; the digit is drawn
independently of the class too. Only the change between frames carries the label.

A deterministic in-memory generator, not a TFDS builder (the videos are a few MB and
cost well under a second to make): `moving_digits(split, count, seed)` draws the digit
rows, the labels (balanced: row i has label i mod 8, then shuffled) and the starts from
numpy's PCG64 seeded with (seed, split index), so the same arguments give the same
bytes (sha256 pinned in tests/vision/test_moving_digits.py).
"""

from __future__ import annotations

import numpy as np

from moejax.data import vision_digits
from moejax.errors import ConfigError

FRAMES = 8
CANVAS = 16
NUM_CLASSES = 8
# (row, col) step per frame of label 0..7: E, SE, S, SW, W, NW, N, NE
DIRECTIONS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))
VIDEO_SHAPE = (FRAMES, CANVAS, CANVAS, 1)


def render(digit_8x8: np.ndarray, start: tuple[int, int], direction: int) -> np.ndarray:
  """One video float32 [FRAMES, CANVAS, CANVAS, 1] of `digit_8x8` (pixels in [0, 1])
  placed with its top-left cell at `start` and rolled DIRECTIONS[direction] per frame."""
  canvas = np.zeros((CANVAS, CANVAS), np.float32)
  canvas[:8, :8] = digit_8x8
  dy, dx = DIRECTIONS[direction]
  frames = [
    np.roll(canvas, (start[0] + t * dy, start[1] + t * dx), axis=(0, 1)) for t in range(FRAMES)
  ]
  return np.stack(frames)[..., None]


def moving_digits(split: str, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(videos float32 [count, 8, 16, 16, 1] in [0, 1], labels int32 [count]) made from
  the digits of `split` ('train' or 'test'); see the module doc."""
  if split not in vision_digits.SPLITS:
    raise ConfigError(f"moving digits: split={split!r} must be one of {vision_digits.SPLITS}")
  if isinstance(count, bool) or not isinstance(count, int) or count < 1:
    raise ConfigError(f"moving digits: count={count!r} must be an int >= 1")
  images, labels = vision_digits.read_digits(vision_digits.source_path())
  rows = np.flatnonzero(np.asarray(vision_digits.split_of_rows(labels)) == split)
  rng = np.random.default_rng([seed, vision_digits.SPLITS.index(split)])
  chosen = rng.choice(rows, count)
  classes = rng.permutation(np.arange(count) % NUM_CLASSES).astype(np.int32)
  starts = rng.integers(0, CANVAS, (count, 2))
  digits = images[chosen, :, :, 0].astype(np.float32) / vision_digits.PIXEL_MAX
  videos = np.stack(
    [render(d, (int(s[0]), int(s[1])), int(c)) for d, s, c in zip(digits, starts, classes)]
  )
  return videos, classes
