"""One interface for model merging over parameter trees (and expert stacks).

A merge method is a registered part (`MERGE_METHODS`, moejax/registry.py) with
declared settings and a function

    fn(base, models, weights, settings) -> merged tree

over pure-dict trees of arrays (a model's params, or the slices of one layer's
expert stack, moejax/merging/experts.py): `base` a tree or None (a method that
needs no base), `models` a list of trees of the same structure and shapes,
`weights` float64 [len(models)]. Arithmetic is float64; each merged leaf is cast
to the dtype of its first input (the base's where one is given).

`bind(name, settings)` parses the settings once (unknown keys and bad values are
ConfigErrors naming `--<key>=<value>`) and returns a `Merge` to call; it checks
the models' shapes (`check_same_shapes`: the first differing parameter path and
both shapes) and, where the method requires the simplex, the weights
(`check_simplex`: non-negative, summing to 1 within 1e-6).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from moejax.errors import ConfigError
from moejax.registry import Registry

SIMPLEX_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class MergeMethod:
  """A registered merge method. `settings`: ((key, default), ...); `validate(settings)`
  raises ConfigError for a bad value; `needs_base`: the method reads `base`;
  `simplex`: its weights must be non-negative and sum to 1."""

  name: str
  fn: Callable[..., dict]
  settings: tuple[tuple[str, Any], ...] = ()
  validate: Callable[[dict], None] | None = None
  needs_base: bool = True
  simplex: bool = False


MERGE_METHODS: Registry[MergeMethod] = Registry("--method")


def register_merge(
  name: str,
  *,
  settings: dict | None = None,
  validate=None,
  needs_base: bool = True,
  simplex: bool = False,
):
  """Decorator: register fn(base, models, weights, settings) as merge method `name`."""

  def wrap(fn):
    MERGE_METHODS.add(
      name, MergeMethod(name, fn, tuple((settings or {}).items()), validate, needs_base, simplex)
    )
    return fn

  return wrap


def finite_number(
  settings: dict,
  key: str,
  *,
  low: float | None = None,
  high: float | None = None,
  low_open: bool = False,
) -> None:
  """ConfigError `--key=value ...` unless settings[key] is a finite number in range."""
  value = settings[key]
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  ok = ok and (low is None or (value > low if low_open else value >= low))
  ok = ok and (high is None or value <= high)
  if not ok:
    lo = "" if low is None else f" {'>' if low_open else '>='} {low}"
    hi = "" if high is None else f" and <= {high}"
    raise ConfigError(f"--{key}={value!r} must be a finite number{lo}{hi}")


@dataclasses.dataclass(frozen=True)
class Merge:
  """A merge method with its settings parsed (`bind`)."""

  method: MergeMethod
  settings: dict

  def __call__(
    self, base: dict | None, models: list, weights=None, *, names: list[str] | None = None
  ) -> dict:
    """The merged tree. weights: None = uniform 1/n. names: how the inputs are named in
    errors (default 'base', 'models[i]')."""
    if not models:
      raise ConfigError("nothing to merge: give at least one model (--experts)")
    if self.method.needs_base and base is None:
      raise ConfigError(f"--method={self.method.name} needs a base model (--base)")
    names = names or ["base"] + [f"models[{i}]" for i in range(len(models))]
    trees = ([base] if base is not None else []) + list(models)
    check_same_shapes(trees, names if base is not None else names[1:])
    weights = uniform(len(models)) if weights is None else check_weights(weights, len(models))
    if self.method.simplex:
      check_simplex(weights)
    return self.method.fn(base, list(models), weights, self.settings)


def bind(name: str, settings: dict | None = None) -> Merge:
  """The method `name` with `settings` over its defaults, validated once."""
  method = MERGE_METHODS.get(name)
  given = dict(settings or {})
  declared = dict(method.settings)
  unknown = sorted(set(given) - set(declared))
  if unknown:
    raise ConfigError(
      f"--{unknown[0]}={given[unknown[0]]!r} is not a setting of "
      f"--method={name}; its settings: {', '.join(sorted(declared)) or 'none'}"
    )
  parsed = {**declared, **given}
  if method.validate is not None:
    method.validate(parsed)
  return Merge(method, parsed)


def uniform(n: int) -> np.ndarray:
  return np.full(n, 1.0 / n, np.float64)


def check_weights(weights, n: int, key: str = "--weights") -> np.ndarray:
  """float64 [n]: one finite weight per model; ConfigError naming `key` otherwise."""
  w = np.asarray(weights, np.float64).reshape(-1)
  if w.size != n:
    raise ConfigError(f"{key}={format_weights(w)} gives {w.size} weights for {n} models")
  bad = [v for v in w if not math.isfinite(v)]
  if bad:
    raise ConfigError(f"{key}={format_weights(w)}: weight {bad[0]} is not finite")
  return w


def check_simplex(weights, key: str = "--weights") -> np.ndarray:
  """The weights, if they lie on the simplex (each >= 0, summing to 1 within
  SIMPLEX_TOLERANCE); else a ConfigError naming the offending value."""
  w = np.asarray(weights, np.float64).reshape(-1)
  negative = [v for v in w if v < 0]
  if negative:
    raise ConfigError(
      f"{key}={format_weights(w)}: weight {negative[0]:g} is negative; "
      "mixture weights must be non-negative and sum to 1"
    )
  total = float(w.sum())
  if abs(total - 1.0) > SIMPLEX_TOLERANCE:
    raise ConfigError(
      f"{key}={format_weights(w)}: the weights sum to {total:.10g}, not 1 "
      f"(tolerance {SIMPLEX_TOLERANCE:g})"
    )
  return w


def format_weights(w) -> str:
  return ",".join(f"{v:g}" for v in np.asarray(w, np.float64).reshape(-1))


def leaves(tree, path=()) -> list[tuple[tuple, Any]]:
  """[(path, leaf)] of a pure-dict tree, keys sorted (paths as tuples of keys)."""
  if isinstance(tree, dict):
    return [item for key in sorted(tree, key=str) for item in leaves(tree[key], path + (key,))]
  return [(path, tree)]


def path_text(path: tuple) -> str:
  return "/".join(map(str, path)) or "(root)"


def check_same_shapes(trees: list, names: list[str]) -> None:
  """ConfigError naming the first parameter path (sorted order) where the trees differ:
  a leaf one of them lacks, or two shapes."""
  first = dict(leaves(trees[0]))
  for tree, name in zip(trees[1:], names[1:]):
    other = dict(leaves(tree))
    for path in sorted(set(first) | set(other), key=lambda p: tuple(map(str, p))):
      if path not in other or path not in first:
        has, lacks = (names[0], name) if path not in other else (name, names[0])
        raise ConfigError(
          f"models differ: parameter {path_text(path)} is in {has} but not in {lacks}"
        )
      a, b = np.shape(first[path]), np.shape(other[path])
      if a != b:
        raise ConfigError(
          f"models differ in shape at parameter {path_text(path)}: "
          f"{tuple(a)} in {names[0]}, {tuple(b)} in {name}"
        )


def map_leaves(fn, base, models: list):
  """A tree like models[0] whose leaf at each path is fn(base leaf or None, [model
  leaves]) (float64 in) cast to the dtype of the base's leaf (the first model's
  without a base)."""
  return map_paths(lambda _, b, ms: fn(b, ms), base, models)


def map_paths(fn, base, models: list, path=()):
  """map_leaves with fn(path, base leaf or None, [model leaves]), keys in models[0]'s order."""
  if isinstance(models[0], dict):
    return {
      k: map_paths(fn, None if base is None else base[k], [m[k] for m in models], path + (k,))
      for k in models[0]
    }
  dtype = np.asarray(base if base is not None else models[0]).dtype
  out = fn(
    path,
    None if base is None else np.asarray(base, np.float64),
    [np.asarray(m, np.float64) for m in models],
  )
  return np.asarray(out).astype(dtype)


def weighted_sum(weights, arrays) -> np.ndarray:
  """sum_i weights[i] * arrays[i] in float64 (one tensordot over the stacked arrays)."""
  return np.tensordot(
    np.asarray(weights, np.float64), np.stack([np.asarray(a, np.float64) for a in arrays]), axes=1
  )
