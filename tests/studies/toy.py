"""A toy scorer and study config for the runner's tests: arm values are known in closed form.

Draw d has a shared offset base_d (large, differs by draw) and a small per-arm noise;
arm 'up' adds (shift + model_shift) * x, where model_shift is the setting that a
study over models varies from model to model. Paired by draw,
up - base = shift * x + small noise, so a correct pairing gives a tight interval
around shift * x, and any other pairing a wide one (the offsets do not cancel).
"""

import ml_collections
import numpy as np

from moejax.studies import scoring
from moejax.studies.spec import grid


class Toy(scoring.Scorer):
  settings = {"noise": 0.01, "offset": 5.0, "misalign": None, "model_shift": 0.0}
  arm_settings = {"shift": 0.0}
  stop_after = None  # tests set it: raise KeyboardInterrupt after this many calls

  def __init__(self, spec):
    super().__init__(spec)
    self.calls = []

  def metrics(self):
    return ("loss", "hit")

  def check(self):
    if self.settings["model_shift"] > 1:
      from moejax.errors import ConfigError

      raise ConfigError(f"study.settings.model_shift={self.settings['model_shift']} must be <= 1")

  def score(self, level, draw, arms):
    if self.stop_after is not None and len(self.calls) >= self.stop_after:
      raise KeyboardInterrupt  # a study stopped by hand
    self.calls.append((level["x"], draw, tuple(arms)))
    out = {}
    for name, arm in arms.items():
      # a misaligned arm is (wrongly) given the next draw's data
      data_draw = (draw + 1) % self.spec.draws if name == self.settings["misalign"] else draw
      base = np.random.default_rng(data_draw).normal() * self.settings["offset"]
      noise = np.random.default_rng((data_draw, len(name))).normal() * self.settings["noise"]
      shift = arm["shift"] + (self.settings["model_shift"] if arm["shift"] else 0.0)
      out[name] = {
        "loss": base + shift * level["x"] + noise,
        "hit": float(arm["shift"] > 0),
        scoring.PAIRING: str(data_draw),
      }
    return out


def config(**overrides) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(
    dict(
      name="toy",
      description="A toy study.",
      scorer="toy",
      settings={},
      arms=[{"name": "base"}, {"name": "up", "shift": 0.1}],
      levels=grid(("x", [1, 2, 4])),
      draws=5,
      reference="base",
      claims=[
        dict(arm="up", reference="base", metric="loss", expect="higher", text="up is higher"),
        dict(
          arm="up",
          metric="hit",
          interval="wilson",
          null=0.5,
          expect="higher",
          at={"x": 4},
          source="spec",
          text="up hits",
        ),
        dict(
          arm="up",
          reference="base",
          metric="loss",
          interval="slope",
          over="x",
          expect="higher",
          text="the gap grows with x",
        ),
      ],
    )
  )
  for key, value in overrides.items():
    c[key] = value
  return c
