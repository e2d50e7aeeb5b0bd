"""A study declared as a config: arms x levels x draws, a scorer, claims.

A study config (configs/studies/<name>.py, `get_config()`) holds:
  name         the study's name; its outputs say it, and a resume checks it
  description  the setting, in a markdown paragraph (what the paper claims, what we run)
  scorer       the registered scorer (moejax/studies/scorers/) that scores arms
  settings     the scorer's settings (its declared keys; defaults fill the rest)
  arms         [{"name": ..., <arm settings>}, ...]: the compared methods, in table order
  levels       [{axis: value, ...}, ...]: the grid every arm runs at (`grid` builds it);
               [{}] for a study without levels
  draws        an int >= 1: draw d is seed d of the scorer's randomness (data, calibration)
  models       optional [{setting: value}, ...]: the trained models (or other outer
               replicates) the study repeats on, each a settings override (e.g. a
               workdir per training seed); draws are nested in each model, and claims
               take their interval over the models' means (the draw-level interval is
               kept beside it). Absent: one model, the settings as given
  reference    the arm the summary table compares every arm against
  claims       [{...}, ...] (`Claim`): what the paper says, tested per level
Settings are parsed once here (`load`); the scorer and the runner get them passed in.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import ml_collections

from moejax.errors import ConfigError
from moejax.evaluation.stats import DIRECTIONS

INTERVALS = ("t", "wilson", "bootstrap", "slope")
SOURCES = {
  "paper": "the paper's claim",
  "spec": "threshold from our spec, not the paper's",
  "ours": "our own check, not the paper's",
}
TRANSFORMS = ("identity", "log", "log2")


def grid(*axes: tuple[str, list]) -> list[dict]:
  """Levels: the product of (axis, values) pairs, the first axis outermost."""
  names = [name for name, _ in axes]
  return [dict(zip(names, values)) for values in itertools.product(*(v for _, v in axes))]


@dataclasses.dataclass(frozen=True)
class Claim:
  """One tested statement, evaluated at each level it applies to.

  arm, metric     the arm and the metric tested
  reference       another arm: test arm - reference paired by draw; None: the arm alone
  null            the value the statistic is compared with (0 for a difference; a
                  threshold for a fraction or a slope)
  expect          the paper's direction of the statistic against `null`: lower/higher/None
  interval        't' (mean over draws, paired with the reference), 'wilson' (a 0/1 metric:
                  fraction of draws), 'bootstrap' (percentile bootstrap of the mean over
                  draws), 'slope' (slope of the metric over the levels' `over` axis, per
                  draw, then a t-interval of the per-draw slopes)
  at              {axis: value}: only levels that match; None: every level
  over, transform the slope's axis and its transform ('identity', 'log', 'log2')
  source          'paper', 'spec' (a threshold from our spec) or 'ours'; labelled in tables
  text            the claim in words
  """

  arm: str
  metric: str
  text: str
  reference: str | None = None
  null: float = 0.0
  expect: str | None = None
  interval: str = "t"
  at: tuple[tuple[str, Any], ...] | None = None
  over: str | None = None
  transform: str = "identity"
  source: str = "paper"

  def matches(self, level: dict) -> bool:
    return self.at is None or all(level.get(k) == v for k, v in self.at)


@dataclasses.dataclass(frozen=True)
class StudySpec:
  name: str
  description: str
  scorer: str
  settings: dict
  arms: tuple[tuple[str, dict], ...]
  levels: tuple[dict, ...]
  draws: int
  reference: str
  claims: tuple[Claim, ...]
  models: tuple[dict, ...] = ({},)

  @property
  def nested(self) -> bool:
    """Whether draws are nested in several models (the unit of the claims is a model)."""
    return len(self.models) > 1

  def model_settings(self, model: int) -> dict:
    return {**self.settings, **self.models[model]}

  def model_label(self, model: int) -> str:
    return ", ".join(f"{k}={v}" for k, v in self.models[model].items()) or "—"

  @property
  def arm_names(self) -> list[str]:
    return [name for name, _ in self.arms]

  @property
  def axes(self) -> list[str]:
    return list(self.levels[0]) if self.levels else []

  def arm(self, name: str) -> dict:
    return dict(self.arms)[name]

  def as_json(self) -> dict:
    """Everything that determines the results (a resume must match it exactly)."""
    models = {"models": list(self.models)} if self.models != ({},) else {}
    return {
      "name": self.name,
      "scorer": self.scorer,
      "settings": self.settings,
      "arms": [{"name": n, **s} for n, s in self.arms],
      "levels": list(self.levels),
      "draws": self.draws,
      **models,
      "reference": self.reference,
      "claims": [dataclasses.asdict(c) for c in self.claims],
    }


def _plain(value, key: str):
  """A JSON value from a config value (ConfigDicts, tuples); ConfigError if it has none."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, dict):
    return {str(k): _plain(v, f"{key}.{k}") for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v, f"{key}[{i}]") for i, v in enumerate(value)]
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  raise ConfigError(f"{key}={value!r} is not a JSON value (a number, string, list or dict)")


KEYS = (
  "name",
  "description",
  "scorer",
  "settings",
  "arms",
  "levels",
  "draws",
  "models",
  "reference",
  "claims",
)
CLAIM_KEYS = tuple(f.name for f in dataclasses.fields(Claim))


def load(
  config: ml_collections.ConfigDict,
  *,
  scorer_defaults: dict | None = None,
  arm_defaults: dict | None = None,
  metrics: tuple[str, ...] | None = None,
) -> StudySpec:
  """The parsed study; ConfigError (naming the key) for anything the runner cannot use.

  With the scorer's declared settings, arm settings and metrics, unknown keys and
  claims on unknown metrics are refused too (`moejax.studies.runner.prepare` passes them)."""
  c = _plain(config, "study")
  unknown = sorted(set(c) - set(KEYS))
  if unknown:
    raise ConfigError(f"study has unknown keys {unknown}; valid: {', '.join(KEYS)}")
  missing = [k for k in ("name", "scorer", "arms", "draws", "claims") if k not in c]
  if missing:
    raise ConfigError(f"study.{missing[0]} is missing")
  draws = c["draws"]
  if not isinstance(draws, int) or isinstance(draws, bool) or draws < 1:
    raise ConfigError(f"study.draws={draws!r} must be an integer >= 1")
  arms = _arms(c["arms"], arm_defaults)
  names = [n for n, _ in arms]
  levels = _levels(c.get("levels", [{}]))
  reference = c.get("reference", names[0])
  if reference not in names:
    raise ConfigError(f"study.reference={reference!r} is not an arm; arms: {', '.join(names)}")
  settings = _with_defaults(
    dict(c.get("settings") or {}),
    scorer_defaults,
    lambda k: f"study.settings.{k} is not a setting of scorer {c['scorer']!r}",
  )
  claims = tuple(_claim(i, raw, names, levels, metrics) for i, raw in enumerate(c["claims"]))
  models = _models(c.get("models", [{}]), scorer_defaults, c["scorer"])
  return StudySpec(
    str(c["name"]),
    str(c.get("description", "")),
    str(c["scorer"]),
    settings,
    arms,
    levels,
    draws,
    reference,
    claims,
    models,
  )


def _models(raw, defaults, scorer: str) -> tuple[dict, ...]:
  if not isinstance(raw, list) or not raw or not all(isinstance(x, dict) for x in raw):
    raise ConfigError(
      f"study.models={raw!r} must be a non-empty list of settings overrides ({{'workdir': ...}})"
    )
  for i, model in enumerate(raw):
    _with_defaults(
      model, defaults, lambda k: f"study.models[{i}].{k} is not a setting of scorer {scorer!r}"
    )
  keys = [json.dumps(model, sort_keys=True) for model in raw]
  if len(set(keys)) != len(keys):
    raise ConfigError(f"study.models gives a model twice: {raw!r}")
  return tuple(raw)


def _arms(raw, defaults) -> tuple[tuple[str, dict], ...]:
  if not isinstance(raw, list) or not raw:
    raise ConfigError("study.arms must be a non-empty list of {'name': ..., settings}")
  arms, seen = [], set()
  for i, arm in enumerate(raw):
    if not isinstance(arm, dict) or not isinstance(arm.get("name"), str) or not arm["name"]:
      raise ConfigError(f"study.arms[{i}]={arm!r} needs a 'name'")
    name, settings = arm["name"], {k: v for k, v in arm.items() if k != "name"}
    if name in seen:
      raise ConfigError(f"study.arms[{i}].name={name!r} is given twice")
    seen.add(name)
    settings = _with_defaults(
      settings, defaults, lambda k: f"study.arms[{i}].{k} (arm {name!r}) is not an arm setting"
    )
    arms.append((name, settings))
  return tuple(arms)


def _with_defaults(given: dict, defaults: dict | None, unknown) -> dict:
  """`given` over `defaults`; ConfigError `unknown(key)` for a key not declared there
  (with no declared defaults, `given` as it is)."""
  if defaults is None:
    return given
  bad = sorted(set(given) - set(defaults))
  if bad:
    raise ConfigError(f"{unknown(bad[0])}; valid: {', '.join(sorted(defaults)) or 'none'}")
  return {**defaults, **given}


def _levels(raw) -> tuple[dict, ...]:
  if not isinstance(raw, list) or not raw or not all(isinstance(x, dict) for x in raw):
    raise ConfigError(
      f"study.levels={raw!r} must be a non-empty list of dicts (moejax.studies.spec.grid)"
    )
  axes = list(raw[0])
  for i, level in enumerate(raw):
    if list(level) != axes:
      raise ConfigError(f"study.levels[{i}]={level!r} has axes {list(level)}, not {axes}")
  keys = [json.dumps(level, sort_keys=True) for level in raw]
  if len(set(keys)) != len(keys):
    raise ConfigError("study.levels gives a level twice")
  return tuple(raw)


def _claim(i: int, raw, arms: list[str], levels, metrics) -> Claim:
  key = f"study.claims[{i}]"
  if not isinstance(raw, dict):
    raise ConfigError(f"{key}={raw!r} must be a dict with arm, metric and text")
  unknown = sorted(set(raw) - set(CLAIM_KEYS))
  if unknown:
    raise ConfigError(f"{key}.{unknown[0]} is not a claim key; valid: {', '.join(CLAIM_KEYS)}")
  for field in ("arm", "metric", "text"):
    if not isinstance(raw.get(field), str):
      raise ConfigError(f"{key}.{field} is missing")
  raw = dict(raw)
  for field in ("arm", "reference"):
    if raw.get(field) is not None and raw[field] not in arms:
      raise ConfigError(
        f"{key}.{field}={raw[field]!r} is not an arm of the study; arms: {', '.join(arms)}"
      )
  if metrics is not None and raw["metric"] not in metrics:
    raise ConfigError(
      f"{key}.metric={raw['metric']!r} is not a metric of the scorer; metrics: {', '.join(metrics)}"
    )
  choices = {
    "expect": DIRECTIONS,
    "interval": INTERVALS,
    "source": tuple(SOURCES),
    "transform": TRANSFORMS,
  }
  for field, valid in choices.items():
    if field in raw and raw[field] not in valid:
      raise ConfigError(f"{key}.{field}={raw[field]!r} must be one of {', '.join(map(str, valid))}")
  interval = raw.get("interval", "t")
  if interval in ("wilson", "bootstrap") and raw.get("reference") is not None:
    raise ConfigError(f"{key}: interval {interval!r} tests one arm; give no reference")
  axes = list(levels[0])
  if interval == "slope":
    if raw.get("over") not in axes:
      raise ConfigError(
        f"{key}.over={raw.get('over')!r} must name a level axis: {', '.join(axes) or 'none'}"
      )
  elif raw.get("over") is not None:
    raise ConfigError(f"{key}.over is only for interval 'slope'")
  at = raw.get("at")
  if at is not None:
    if not isinstance(at, dict) or any(k not in axes for k in at):
      raise ConfigError(f"{key}.at={at!r} must map level axes ({', '.join(axes)}) to values")
    if not any(all(level[k] == v for k, v in at.items()) for level in levels):
      raise ConfigError(f"{key}.at={at!r} matches no level of the study")
    raw["at"] = tuple(at.items())
  raw["null"] = float(raw.get("null", 0.0))
  return Claim(**raw)
