"""The protocol of a post-training method: a registered part (moejax/registry.py
`Registry`) with a name, a kind, declared settings and the function that does the
work, as merge and edit methods are (moejax/merging/base.py, moejax/editing/methods.py).

The function is named as "module:function" and imported on its first call, so a
registry of names (moejax/posttrain/methods.py) imports nothing heavier than this
file, and a command checks its flags before it imports jax. `lookup` is the name
check: a ConfigError naming the flag, the bad value and every valid name.

Settings are bound once: `Method.bind(**settings)` takes each setting over its
declared default, refuses one the method does not declare (`--key=value is not a
setting of --method=name`, one line) and checks each value against its default's
type and, for a string with declared choices, against them. The bound method
(`Bound`) calls the function with its positional arguments, the method's `fixed`
keywords and the settings. `bind_from(values)` binds, of a command's shared flags
(a pruning request's objective, seed, normalisation), those the method declares;
the others it does not read.

What each kind's function returns is the contract tests/contract/ hold every
registered method to (see moejax/posttrain/methods.py for the three registries).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import numbers
from typing import Any, Callable, Iterator, Mapping

from moejax.errors import ConfigError, choice_error
from moejax.registry import Registry


@dataclasses.dataclass(frozen=True)
class Method:
  """A registered post-training method.

  kind: what its function is (the registry's module doc lists each kind's protocol).
  target: the function, "module:function" (imported on first use) or a callable.
  settings: ((key, default), ...), the method's own, bound by `bind`; choices:
  ((key, valid values), ...) for string settings. fixed: keywords the function
  always gets (not settings: a score's name). needs: the calibration data it reads
  beyond its kind's ('step_score', 'hessians', 'inputs', 'outputs'). merge: a
  pruner's own merge rule (prune.MERGES). flag: how a command names it (messages).
  """

  name: str
  kind: str
  target: str | Callable
  settings: tuple[tuple[str, Any], ...] = ()
  choices: tuple[tuple[str, tuple], ...] = ()
  fixed: tuple[tuple[str, Any], ...] = ()
  needs: tuple[str, ...] = ()
  merge: str = "none"
  flag: str = "--method"

  @property
  def defaults(self) -> dict:
    return dict(self.settings)

  @property
  def fn(self) -> Callable:
    """The function: `target` itself, or imported from "module:function"."""
    if callable(self.target):
      return self.target
    module, name = self.target.split(":")
    return getattr(importlib.import_module(module), name)

  def bind(self, **settings) -> "Bound":
    """The method with `settings` over its defaults, each known and well typed."""
    declared = self.defaults
    for key, value in settings.items():
      if key not in declared:
        raise ConfigError(
          f"--{key}={value!r} is not a setting of {self.flag}={self.name}; its settings: "
          f"{', '.join(sorted(declared)) or 'none'}"
        )
      declared[key] = self._checked(key, value, declared[key])
    return Bound(self, declared)

  def bind_from(self, values: Mapping[str, Any]) -> "Bound":
    """`bind` of those `values` that are settings of this method (module doc)."""
    return self.bind(**{k: v for k, v in values.items() if k in self.defaults})

  def _checked(self, key: str, value, default):
    where = f"--{key}={value!r} ({self.flag}={self.name})"
    if isinstance(default, bool):
      if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false")
      return value
    if isinstance(default, numbers.Number):
      if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{where} must be a number")
      if not math.isfinite(value):
        raise ConfigError(f"{where} must be finite")
      if not isinstance(default, numbers.Integral):
        return float(value)
      if not isinstance(value, numbers.Integral):
        raise ConfigError(f"{where} must be an integer")
      return int(value)
    if isinstance(default, str) and not isinstance(value, str):
      raise ConfigError(f"{where} must be a string")
    valid = dict(self.choices).get(key)
    if valid is not None and value not in valid:
      raise choice_error(f"--{key}", value, valid)
    return value


@dataclasses.dataclass(frozen=True)
class Bound:
  """A method with its settings bound; calling it runs the function."""

  method: Method
  settings: dict

  def __call__(self, *args, **call):
    return self.method.fn(*args, **call, **dict(self.method.fixed), **self.settings)


def add(registry: Registry[Method], method: Method) -> Method:
  """Register `method` under its name, named in messages by the registry's flag."""
  return registry.add(method.name, dataclasses.replace(method, flag=registry.config_key))


def names(registry: Registry[Method], kind: str | None = None) -> tuple[str, ...]:
  """The registered names (of one kind), in registration order."""
  return tuple(n for n, m in registry.items() if kind is None or m.kind == kind)


def lookup(
  registry: Registry[Method], name: str, key: str | None = None, kind: str | None = None
) -> Method:
  """The method `name` (of `kind`); else a ConfigError `key=name is not known;
  valid: ...` (key: the registry's flag by default)."""
  valid = names(registry, kind)
  if name not in valid:
    raise choice_error(key or registry.config_key, name, valid)
  return registry.get(name)


class Names:
  """A live, read-only view of names (a registry's, or some of them): iterates,
  answers `in` and `len` from the registries as they are now, as the tuples it
  replaces did (a method registered later is in it)."""

  def __init__(self, names_now: Callable[[], tuple[str, ...]]):
    self._names = names_now

  def __iter__(self) -> Iterator[str]:
    return iter(self._names())

  def __contains__(self, name) -> bool:
    return name in self._names()

  def __len__(self) -> int:
    return len(self._names())

  def __add__(self, other) -> tuple[str, ...]:
    return self._names() + tuple(other)

  def __repr__(self) -> str:
    return repr(self._names())
