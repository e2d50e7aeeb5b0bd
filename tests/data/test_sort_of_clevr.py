"""The Sort-of-CLEVR style VQA set (moejax/data/sort_of_clevr.py): the same arguments give
the same bytes (sha256 pinned), answers of hand-built scenes worked out by hand, every
drawn row's answer recomputed from its decoded scene, one-line refusals naming the key."""

import hashlib

import numpy as np
import pytest

from moejax.data import sort_of_clevr as sc
from moejax.errors import ConfigError

# train, every type, 8 per type, seed 0
PINNED = "d2ae714623a7837dffa2bfe46c9468d2a9489b14c334f8ccf394cd97d28becbb"


def sha256(*arrays) -> str:
  h = hashlib.sha256()
  for a in arrays:
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


def test_the_same_seed_gives_the_same_bytes():
  first = sc.sort_of_clevr("train", sc.QUESTION_TYPES, 8, seed=0)
  assert [a.shape for a in first] == [(48, 12, 12, 3), (48, 12), (48,)]
  assert [a.dtype for a in first] == [np.float32, np.float32, np.int32]
  assert sha256(*first) == sha256(*sc.sort_of_clevr("train", sc.QUESTION_TYPES, 8, seed=0))
  assert sha256(*first) == PINNED
  assert sha256(*sc.sort_of_clevr("train", sc.QUESTION_TYPES, 8, seed=1)) != PINNED
  assert sha256(*sc.sort_of_clevr("test", sc.QUESTION_TYPES, 8, seed=0)) != PINNED


# red square at (0, 0), green circle at (0, 3), blue circle at (3, 0), orange square at (2, 2)
SCENE = sc.Scene(colours=(0, 1, 2, 3), shapes=(0, 1, 1, 0), cells=((0, 0), (0, 3), (3, 0), (2, 2)))
RED, GREEN, BLUE, ORANGE, GRAY = 0, 1, 2, 3, 4


@pytest.mark.parametrize(
  "kind, colour, expected",
  [
    ("exists", RED, "yes"),
    ("exists", GRAY, "no"),
    ("shape", RED, "square"),
    ("shape", GREEN, "circle"),
    ("left", RED, "yes"),
    ("left", GREEN, "no"),
    ("top", RED, "yes"),
    ("top", BLUE, "no"),
    ("top", ORANGE, "no"),
    ("nearest", RED, "orange"),  # squared distances 9 (green), 9 (blue), 8 (orange)
    ("nearest", GREEN, "orange"),  # 9 (red), 18 (blue), 5 (orange)
    ("nearest", BLUE, "orange"),  # 9 (red), 18 (green), 5 (orange)
    ("count", RED, "2"),  # red and orange are squares
    ("count", BLUE, "2"),  # green and blue are circles
  ],
)
def test_answers_of_a_hand_built_scene(kind, colour, expected):
  assert sc.ANSWERS[sc.answer(SCENE, kind, colour)] == expected


def test_a_question_without_one_answer_is_refused():
  with pytest.raises(ValueError, match="tie"):
    sc.answer(SCENE, "nearest", ORANGE)  # green and blue both at squared distance 5
  with pytest.raises(ValueError, match="absent"):
    sc.answer(SCENE, "shape", GRAY)
  lone = sc.Scene(colours=(0, 1, 2, 3), shapes=(0, 0, 0, 1), cells=((0, 0), (0, 1), (1, 0), (3, 3)))
  assert sc.ANSWERS[sc.answer(lone, "count", 3)] == "1"
  assert sc.ANSWERS[sc.answer(lone, "count", 0)] == "3"


def test_the_rendered_pixels():
  image = sc.render(SCENE)
  np.testing.assert_array_equal(image[0:3, 0:3], np.broadcast_to(sc.RGB[RED], (3, 3, 3)))
  np.testing.assert_array_equal(image[1, 9:12], np.broadcast_to(sc.RGB[GREEN], (3, 3)))
  np.testing.assert_array_equal(image[0, 9], np.zeros(3))  # a circle's corner is empty
  assert image.sum() == pytest.approx(9 * 1 + 5 * 1 + 5 * 1 + 9 * 1.5)
  assert np.count_nonzero(image[3:9, 3:6]) == 0


def decoded(image) -> sc.Scene:
  """The scene drawn in `image`, read back cell by cell."""
  colours, shapes, cells = [], [], []
  for row in range(sc.GRID):
    for col in range(sc.GRID):
      block = image[row * 3 : row * 3 + 3, col * 3 : col * 3 + 3]
      if block.any():
        centre = block[1, 1]
        colours.append(int(np.argmin(np.abs(sc.RGB - centre).sum(-1))))
        shapes.append(int(not block[0, 0].any()))
        cells.append((row, col))
  return sc.Scene(tuple(colours), tuple(shapes), tuple(cells))


def test_every_drawn_answer_matches_its_decoded_scene():
  images, questions, answers = sc.sort_of_clevr("test", sc.QUESTION_TYPES, 20, seed=3)
  counts = np.zeros(len(sc.QUESTION_TYPES), int)
  for image, question, a in zip(images, questions, answers):
    kind = sc.QUESTION_TYPES[int(np.argmax(question[: len(sc.QUESTION_TYPES)]))]
    colour = int(np.argmax(question[len(sc.QUESTION_TYPES) :]))
    assert question.sum() == 2
    scene = decoded(image)
    assert len(scene.colours) == sc.OBJECTS == len(set(scene.colours))
    assert sc.answer(scene, kind, colour) == a
    counts[sc.QUESTION_TYPES.index(kind)] += 1
  assert counts.tolist() == [20] * len(sc.QUESTION_TYPES)  # type after type


@pytest.mark.parametrize(
  "args, name",
  [
    (("val", ["shape"], 4), "split='val'"),
    (("train", ["shape"], 0), "count=0"),
    (("train", ["shape", "colour"], 4), "'colour'"),
    (("train", [], 4), "question types []"),
  ],
)
def test_bad_arguments_are_refused_in_one_line(args, name):
  with pytest.raises(ConfigError) as error:
    sc.sort_of_clevr(*args)
  assert "\n" not in str(error.value) and name in str(error.value)
