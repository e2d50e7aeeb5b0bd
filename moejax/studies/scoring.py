"""The scorer contract: what a study calls to score its arms at one (level, draw).

A scorer is a registered class (moejax/studies/scorers/<name>.py, `@SCORERS.register`):

    @SCORERS.register("kmeans_lloyd_hartigan")
    class LloydHartigan(Scorer):
      settings = {"n": 40, "trials": ...}        # declared settings and their defaults
      arm_settings = {"algorithm": "lloyd"}       # declared per-arm settings
      def metrics(self): return ("returns_initial", "nmi")
      def score(self, level, draw, arms): ...     # {arm: {metric: float}}

The runner builds it once with the parsed settings (`self.settings`, the study
`self.spec`), asks `metrics()` and `check()` before any run, then calls `score`
for each (level, draw) with the arms still to run there, draws outermost. A
study over several models (`models`) gets one scorer per model (`for_model`),
each with that model's settings and checked before any run. `model_digest()`
names the trained model a scorer reads (its `workdir` setting's latest checkpoint):
a resumed study refuses to add runs on another model. A
score may carry PAIRING (a digest of the draw's shared input, e.g. the
calibration windows): the runner refuses to pair arms whose digests differ.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from moejax.registry import Registry, import_package_modules
from moejax.studies.spec import StudySpec

SCORERS: Registry[type["Scorer"]] = Registry("study.scorer")
PAIRING = "pairing"


class Scorer:
  settings: dict[str, Any] = {}  # class attribute: declared settings (defaults)
  arm_settings: dict[str, Any] = {}  # class attribute: declared arm settings (defaults)
  models: list["Scorer"]  # a nested study's per-model scorers (set by runner.run)

  def __init__(self, spec: StudySpec) -> None:
    self.spec = spec
    self.settings = dict(spec.settings)

  def for_model(self, model: int) -> "Scorer":
    """The scorer of the study's model `model` (this one for a one-model study)."""
    if not self.spec.nested:
      return self
    scorer = type(self)(self.spec)
    scorer.settings = self.spec.model_settings(model)
    return scorer

  def metrics(self) -> tuple[str, ...]:
    raise NotImplementedError

  def model_digest(self) -> str | None:
    """sha256 (moejax.train.zoo.tree_digest) of the parameters and router state of the
    trained model this scorer reads: the latest checkpoint of a training workdir in
    its `workdir` setting; None when it reads none. A model retrained from the same
    seed has the same digest (the zoo's training is deterministic), so a study can
    resume on it in a later session."""
    workdir = self.settings.get("workdir")
    if not isinstance(workdir, str) or not os.path.isdir(os.path.join(workdir, "checkpoints")):
      return None
    from moejax.train.restore import load_from_workdir
    from moejax.train.zoo import tree_digest

    return tree_digest(*load_from_workdir(workdir)[2:4])

  def check(self) -> None:
    """ConfigError (naming study.settings.<key>, an arm or a level) before any run."""

  def applies(self, arm: str, level: dict) -> bool:
    """Whether `arm` runs at `level` (e.g. an arm defined only at integer bits)."""
    return True

  def score(self, level: dict, draw: int, arms: dict[str, dict]) -> dict[str, dict[str, float]]:
    """{arm: {metric: value}} for every arm in `arms` (name -> settings)."""
    raise NotImplementedError

  def check_integers(self, minimum: dict) -> None:
    """ConfigError unless each setting named in `minimum` is an integer >= its value."""
    from moejax.errors import ConfigError

    for key, low in minimum.items():
      value = self.settings[key]
      if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"study.settings.{key}={value!r} must be an integer >= {low}")

  def check_numbers(self, keys, *, positive: bool) -> None:
    """ConfigError unless each setting in `keys` is a number > 0 (positive) or >= 0."""
    from moejax.errors import ConfigError

    for key in keys:
      value = self.settings[key]
      number = isinstance(value, (int, float)) and not isinstance(value, bool)
      if not number or not (value > 0 if positive else value >= 0):  # NaN fails too
        raise ConfigError(
          f"study.settings.{key}={value!r} must be a number {'>' if positive else '>='} 0"
        )

  def notes(self, results: dict) -> str:
    """Markdown the scorer adds after the claims and the summary (optional)."""
    return ""

  def plot(self, results: dict, path: str) -> bool:
    """Draw a figure of its own to `path`; False: the runner's default plot."""
    return False


def get(name: str) -> type[Scorer]:
  """The scorer class registered as `name` (ConfigError listing the valid names)."""
  from moejax.studies import scorers

  import_package_modules(scorers.__name__, scorers.__path__)
  return SCORERS.get(name)


def defaults_with(name: str, overrides: dict | None = None) -> dict:
  """A study config's settings: scorer `name`'s declared settings with `overrides`
  (every key present, so each can be set from the command line); ConfigError naming
  an override the scorer does not declare."""
  from moejax.errors import ConfigError

  declared = get(name).settings
  unknown = sorted(set(overrides or {}) - set(declared))
  if unknown:
    raise ConfigError(f"study.settings.{unknown[0]} is not a setting of scorer {name!r}")
  return {**declared, **(overrides or {})}


def digest(*arrays) -> str:
  """A short digest of arrays (shape, dtype and bytes): a draw's pairing key."""
  h = hashlib.sha256()
  for a in arrays:
    a = np.ascontiguousarray(np.asarray(a))
    h.update(f"{a.shape}{a.dtype}".encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]
