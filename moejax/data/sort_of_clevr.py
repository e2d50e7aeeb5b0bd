"""A small Sort-of-CLEVR style visual question answering set, made in memory from a seed.

Each scene is SIZE x SIZE = 12 x 12 RGB pixels (float32 in [0, 1]) on a GRID x GRID = 4 x 4
grid of 3 x 3 cells: OBJECTS = 4 objects, each of a distinct colour of the 6 COLOURS,
a shape of SHAPES (a square fills its cell; a "circle" is the 5-pixel plus in it) and
its own cell. A question is (type, colour), encoded as a float32 vector of
QUESTION_DIM = 12: one-hot of the type over QUESTION_TYPES, then one-hot of the colour.
Every answer is an index into ONE answer space, ANSWERS (14: yes/no, the 2 shapes,
the 6 colours, the counts 1..4):

  exists   is there an object of colour c?                  yes / no (half each)
  shape    the shape of the object of colour c               square / circle
  left     is the object of colour c in the left half?       yes / no
  top      is the object of colour c in the top half?        yes / no
  nearest  the colour of the object nearest to c             a colour (Euclidean between
                                                             cell centres; the question's
                                                             colour is drawn among those
                                                             whose nearest is unique)
  count    how many objects have the shape of c's object?    1 .. 4

`exists` needs absent colours (4 of 6 present); the others ask about a present one.

    images, questions, answers = sort_of_clevr("train", ("shape", "left"), count=64, seed=0)

gives count rows per type, type after type: images [N, 12, 12, 3], questions
[N, 12], answers int32 [N]. numpy's PCG64 is seeded with (seed, split index), so the
same arguments give the same bytes (sha256 pinned in tests/data/test_sort_of_clevr.py).

How it differs from Sort-of-CLEVR (Santoro et al. 2017, "A simple neural network module
for relational reasoning", sec. 4): 12 x 12 pixels on a 4 x 4 grid of cells (not
75 x 75 with free positions), 4 objects of 6 colours (not all 6 in every scene), a
plus for the circle, a 12-number question (not 11 bits), and our own question types:
left/top and exists are non-relational, nearest and count relational (the original
asks nearest/farthest shape and same-shape count); answers share one space here, so
the types can be tasks of a continual stream in a unified answer space.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from moejax.errors import ConfigError

SIZE, GRID, OBJECTS = 12, 4, 4
CELL = SIZE // GRID
COLOURS = ("red", "green", "blue", "orange", "gray", "yellow")
RGB = np.array(
  [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0.5, 0], [0.5, 0.5, 0.5], [1, 1, 0]], np.float32
)
SHAPES = ("square", "circle")
QUESTION_TYPES = ("exists", "shape", "left", "top", "nearest", "count")
QUESTION_DIM = len(QUESTION_TYPES) + len(COLOURS)
ANSWERS = ("yes", "no", *SHAPES, *COLOURS, *(str(n) for n in range(1, OBJECTS + 1)))
SPLITS = ("train", "test", "pretrain")
PLUS = np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]], np.float32)


@dataclasses.dataclass(frozen=True)
class Scene:
  """OBJECTS objects: colour indices (distinct), shape indices, cells (row, col) distinct."""

  colours: tuple[int, ...]
  shapes: tuple[int, ...]
  cells: tuple[tuple[int, int], ...]


def render(scene: Scene) -> np.ndarray:
  """float32 [SIZE, SIZE, 3]: each object's shape in its colour, in its cell."""
  image = np.zeros((SIZE, SIZE, 3), np.float32)
  for colour, shape, (row, col) in zip(scene.colours, scene.shapes, scene.cells):
    mask = np.ones((CELL, CELL), np.float32) if SHAPES[shape] == "square" else PLUS
    rows, cols = slice(row * CELL, (row + 1) * CELL), slice(col * CELL, (col + 1) * CELL)
    image[rows, cols] = mask[..., None] * RGB[colour]
  return image


def nearest(scene: Scene, colour: int) -> int | None:
  """The colour of the object nearest to `colour`'s (None when two are equally near)."""
  i = scene.colours.index(colour)
  here = np.array(scene.cells[i])
  dist = {
    c: float(np.sum((np.array(cell) - here) ** 2)) for c, cell in zip(scene.colours, scene.cells)
  }
  del dist[colour]
  best = min(dist.values())
  closest = [c for c, d in dist.items() if d == best]
  return closest[0] if len(closest) == 1 else None


def answer(scene: Scene, kind: str, colour: int) -> int:
  """The index in ANSWERS of question (`kind`, `colour`) about `scene` (module doc);
  ValueError where the question has no single answer (an absent colour, a tie)."""
  yes, no = ANSWERS.index("yes"), ANSWERS.index("no")
  if kind == "exists":
    return yes if colour in scene.colours else no
  if colour not in scene.colours:
    raise ValueError(f"{kind} question about colour {COLOURS[colour]!r}, absent from the scene")
  i = scene.colours.index(colour)
  row, col = scene.cells[i]
  if kind == "shape":
    return ANSWERS.index(SHAPES[scene.shapes[i]])
  if kind == "left":
    return yes if col < GRID // 2 else no
  if kind == "top":
    return yes if row < GRID // 2 else no
  if kind == "nearest":
    other = nearest(scene, colour)
    if other is None:
      raise ValueError(f"nearest question about {COLOURS[colour]!r}: two objects tie")
    return ANSWERS.index(COLOURS[other])
  if kind == "count":
    return ANSWERS.index(str(scene.shapes.count(scene.shapes[i])))
  raise ValueError(f"question type {kind!r} is not one of {QUESTION_TYPES}")


def question_vector(kind: str, colour: int) -> np.ndarray:
  """float32 [QUESTION_DIM]: one-hot of the type, then one-hot of the colour."""
  v = np.zeros(QUESTION_DIM, np.float32)
  v[QUESTION_TYPES.index(kind)] = 1
  v[len(QUESTION_TYPES) + colour] = 1
  return v


def random_scene(rng: np.random.Generator) -> Scene:
  colours = rng.choice(len(COLOURS), OBJECTS, replace=False)
  shapes = rng.integers(0, len(SHAPES), OBJECTS)
  cells = rng.choice(GRID * GRID, OBJECTS, replace=False)
  return Scene(
    tuple(int(c) for c in colours),
    tuple(int(s) for s in shapes),
    tuple((int(c) // GRID, int(c) % GRID) for c in cells),
  )


def draw_question(rng: np.random.Generator, kind: str) -> tuple[Scene, int]:
  """A scene and a colour whose question of type `kind` has one answer (module doc)."""
  while True:
    scene = random_scene(rng)
    if kind == "exists":
      present = bool(rng.integers(0, 2))
      pool = [c for c in range(len(COLOURS)) if (c in scene.colours) == present]
    elif kind == "nearest":
      pool = [c for c in scene.colours if nearest(scene, c) is not None]
    else:
      pool = list(scene.colours)
    if pool:
      return scene, int(rng.choice(pool))


def sort_of_clevr(
  split: str, types: Sequence[str], count: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(images float32 [N, 12, 12, 3], questions float32 [N, QUESTION_DIM], answers int32
  [N]), N = count * len(types): `count` rows of each type, in the order of `types`."""
  if split not in SPLITS:
    raise ConfigError(f"sort_of_clevr: split={split!r} must be one of {SPLITS}")
  if isinstance(count, bool) or not isinstance(count, int) or count < 1:
    raise ConfigError(f"sort_of_clevr: count={count!r} must be an int >= 1")
  bad = [t for t in types if t not in QUESTION_TYPES]
  if bad or not types:
    raise ConfigError(
      f"sort_of_clevr: question types {list(types)!r} must be a non-empty list of {QUESTION_TYPES}"
    )
  rng = np.random.default_rng([seed, SPLITS.index(split)])
  images, questions, answers = [], [], []
  for kind in types:
    for _ in range(count):
      scene, colour = draw_question(rng, kind)
      images.append(render(scene))
      questions.append(question_vector(kind, colour))
      answers.append(answer(scene, kind, colour))
  return np.stack(images), np.stack(questions), np.asarray(answers, np.int32)
