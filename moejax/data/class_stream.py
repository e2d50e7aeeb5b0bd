"""Class-incremental streams (van de Ven et al. 2022, "Three types of incremental
learning"): the classes of a labelled dataset split into tasks seen one after another.

    tasks = class_incremental_tasks(class_order, classes_per_task)   # [[3, 7], [0, 5], ...]
    rows = task_rows(labels, tasks)                                  # row indices per task

Task t holds the classes class_order[t * c : (t + 1) * c]; a model learns task 0 to
T - 1 in order and is evaluated on every task seen so far, with no task identity at
test time (class-incremental). `shuffled_class_order(num_classes, seed)` is the usual
random order (a fresh one per seed, as the continual-learning benchmarks do).
`blurry_task_rows(labels, tasks, fraction, seed)` blurs the boundaries: a fraction of
each task's rows moves to a neighbouring task (general continual learning, FlyPrompt).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moejax.errors import ConfigError


def shuffled_class_order(num_classes: int, seed: int) -> list[int]:
  """A permutation of range(num_classes) drawn from numpy default_rng(seed)."""
  return [int(c) for c in np.random.default_rng(seed).permutation(num_classes)]


def class_incremental_tasks(
  class_order: Sequence[int], classes_per_task: int, name: str = "class_order"
) -> list[list[int]]:
  """The tasks' classes: consecutive groups of `classes_per_task` in `class_order`.
  ConfigError naming `name` for a repeated class or a length the group size does
  not divide."""
  order = [int(c) for c in class_order]
  repeated = sorted({c for c in order if order.count(c) > 1})
  if repeated:
    raise ConfigError(f"{name}={order} repeats classes {repeated}")
  if isinstance(classes_per_task, bool) or not isinstance(classes_per_task, int):
    raise ConfigError(f"classes_per_task={classes_per_task!r} must be an int")
  if classes_per_task < 1 or not order or len(order) % classes_per_task:
    raise ConfigError(
      f"classes_per_task={classes_per_task} must be >= 1 and divide the "
      f"{len(order)} classes of {name}"
    )
  return [order[i : i + classes_per_task] for i in range(0, len(order), classes_per_task)]


def task_rows(labels: np.ndarray, tasks: Sequence[Sequence[int]]) -> list[np.ndarray]:
  """Per task, the indices of the rows whose label is one of its classes, in order."""
  labels = np.asarray(labels)
  return [np.flatnonzero(np.isin(labels, list(classes))) for classes in tasks]


def blurry_task_rows(
  labels: np.ndarray, tasks: Sequence[Sequence[int]], fraction: float, seed: int
) -> list[np.ndarray]:
  """task_rows with blurry boundaries (Blurry-M, Bang et al. 2021 "Rainbow Memory",
  sec. 5: M% of a task's samples come from other tasks): round(fraction * n_t) rows of
  each task t, drawn at random, move to a neighbouring task (t - 1 or t + 1 with equal
  chance; the one neighbour at either end). Moving to the *neighbouring* tasks only is
  our choice (so a class leaks at most one task early or late); every row stays in
  exactly one task, each task's rows sorted. fraction 0 gives task_rows. ConfigError
  naming blurry_fraction outside [0, 1)."""
  if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
    raise ConfigError(f"blurry_fraction={fraction!r} must be a number in [0, 1)")
  if not 0 <= fraction < 1:
    raise ConfigError(f"blurry_fraction={fraction!r} must be a number in [0, 1)")
  own = task_rows(labels, tasks)
  if fraction == 0 or len(own) < 2:
    return own
  rng = np.random.default_rng(seed)
  kept: list[list[np.ndarray]] = [[] for _ in own]
  for t, rows in enumerate(own):
    moved = rng.permutation(len(rows))[: int(round(fraction * len(rows)))]
    stay = np.ones(len(rows), bool)
    stay[moved] = False
    kept[t].append(rows[stay])
    neighbours = [n for n in (t - 1, t + 1) if 0 <= n < len(own)]
    to = rng.choice(neighbours, len(moved))
    for n in neighbours:
      kept[n].append(rows[moved[to == n]])
  return [np.sort(np.concatenate(parts)) for parts in kept]
