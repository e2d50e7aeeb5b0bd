"""Name -> implementation tables for the swappable parts (routers, expert types,
dispatch, grouped matmuls, losses).

A lookup of an unknown name raises a ConfigError that names the config key,
the bad value and every valid name. Tests iterate a registry (`items()`) to
check every registered part against one contract (tests/contract/), and
`temporarily` registers a part for the duration of a `with` block only.
"""

import contextlib
import dataclasses
import importlib
import math
import pkgutil
from collections.abc import Mapping
from typing import Any, Callable, Generic, Iterator, TypeVar

import ml_collections

from moejax.errors import ConfigError, choice_error

T = TypeVar("T")


class Registry(Generic[T]):
  def __init__(self, config_key: str):
    self.config_key = config_key
    self._items: dict[str, T] = {}

  def add(self, name: str, item: T) -> T:
    if name in self._items:
      raise ValueError(f"{self.config_key}: {name!r} registered twice")
    self._items[name] = item
    return item

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator form of `add`."""
    return lambda item: self.add(name, item)

  def remove(self, name: str) -> T:
    """Unregister `name` (KeyError if absent); returns what was registered."""
    return self._items.pop(name)

  @contextlib.contextmanager
  def temporarily(self, name: str, item: T) -> Iterator[T]:
    """Register `item` as `name` inside the block only (tests: a deliberately
    wrong part). Raises like `add` if `name` is taken; removed on exit, also
    when the block raises."""
    self.add(name, item)
    try:
      yield item
    finally:
      if self._items.get(name) is item:
        del self._items[name]

  def get(self, name: str) -> T:
    if name not in self._items:
      raise choice_error(self.config_key, name, self._items)
    return self._items[name]

  def items(self) -> list[tuple[str, T]]:
    """(name, item) pairs in registration order (a copy)."""
    return list(self._items.items())

  def __contains__(self, name) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(list(self._items))

  def __len__(self) -> int:
    return len(self._items)


def frozen(value):
  """`value` as a hashable constant: mappings (dict, ConfigDict) as Settings, lists
  and tuples as tuples, anything else unchanged."""
  if isinstance(value, (Mapping, ml_collections.ConfigDict)):
    return Settings(value)
  if isinstance(value, (list, tuple)):
    return tuple(frozen(v) for v in value)
  return value


class Settings(Mapping[str, Any]):
  """A frozen, hashable mapping over sorted keys: a part's parsed settings
  (`PartSettings.parse`), and any other constant map a module keeps. Being
  hashable and no pytree, it is a static attribute of an nnx Module (part of the
  graph definition, like the layer's FrozenConfigDict) and a constant under jit."""

  __slots__ = ("_items", "_dict")
  _items: tuple[tuple[str, Any], ...]
  _dict: dict[str, Any]

  def __init__(self, values=()):
    pairs = values.items() if hasattr(values, "items") else values
    items = tuple(sorted((str(key), frozen(value)) for key, value in pairs))
    object.__setattr__(self, "_items", items)
    object.__setattr__(self, "_dict", dict(items))

  def __getitem__(self, key: str):
    return self._dict[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self._dict)

  def __len__(self) -> int:
    return len(self._items)

  def __hash__(self) -> int:
    return hash(self._items)

  def __setattr__(self, name, value):
    raise dataclasses.FrozenInstanceError(f"Settings are frozen: cannot set {name!r}")

  def __reduce__(self):
    return (Settings, (self._items,))

  def __repr__(self) -> str:
    return f"Settings({self._dict!r})"


# A part's own settings (routers, expert types, losses, dispatchers, grouped
# matmuls): defaults declared in the part's file, held in one config section under
# model.moe, which config.base_config builds from the registries (adding a part
# edits no config.py):
#   router or expert type <name>: model.moe.<name>           (model.moe.sere.rho)
#   loss <name>:                  model.moe.losses.<name>    (model.moe.losses.dpsl.alpha)
#   dispatcher, grouped matmul:   the section it declares    (model.moe.dropless.tile,
#                                 model.moe.capacity.factor, model.moe.gmm.backend)
#   routing keys routers share:   model.moe.routing          (model.moe.routing.renormalize)
# Losses have a namespace of their own, so a loss may share a router's name. Parts
# that read the same settings share one section (dispatchers 'dropless' and
# 'dropless_memeff': model.moe.dropless).


def section_of(cfg, path: str):
  """cfg.<path> for a dotted `path` ('sere', 'losses.dpsl'), or None where missing."""
  node = cfg
  for part in path.split("."):
    node = None if node is None else node.get(part)
  return node


def settings_of(cfg, path: str, defaults) -> dict:
  """The part's settings: `cfg.<path>` over its declared defaults (a default
  wherever the section or a key is missing, e.g. a hand-built cfg)."""
  section = None if cfg is None else section_of(cfg, path)
  return {
    key: (default if section is None else section.get(key, default))
    for key, default in dict(defaults).items()
  }


def check_section(cfg, path: str, defaults, what: str) -> None:
  """ConfigError if model.moe.<path> holds keys `what` does not declare."""
  section = section_of(cfg, path)
  if section is None:
    return
  unknown = set(section) - set(dict(defaults))
  if unknown:
    raise ConfigError(
      f"model.moe.{path} has unknown keys {sorted(unknown)}; {what} has "
      f"settings {sorted(dict(defaults))}"
    )


def check_number(where: str, value, *, integer: bool = False, low=0, strict: bool = True) -> None:
  """ConfigError naming `where` (model.moe.<path>.<key>) unless `value` is a finite
  number (an int where `integer`; a bool is neither) > low (>= low where not strict)."""
  kinds = (int,) if integer else (int, float)
  ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
  if not ok or value < low or (strict and value == low):
    what = "an int" if integer else "a finite number"
    raise ConfigError(f"{where}={value!r} must be {what} {'>' if strict else '>='} {low}")


@dataclasses.dataclass(frozen=True)
class PartSettings:
  """One part's settings section, model.moe.<path> (see above).

  defaults: ((key, default), ...). legacy_keys: ((flat model.moe key of older
  configs, key), ...), moved into the section when a stored config loads
  (`migrate`) and refused in a live config (a flat key would be ignored).
  validate: model.moe ConfigDict -> None, ConfigError naming model.moe.<path>.<key>
  and the value; it runs whether or not the part is in use (a router or loss
  declares its own check on its parsed config; RouterSpec, LossSpec).
  """

  path: str
  what: str  # "router 'sere'", for messages
  defaults: tuple[tuple[str, Any], ...]
  legacy_keys: tuple[tuple[str, str], ...] = ()
  validate: Callable[[Any], None] | None = None

  def parse(self, moe=None) -> Settings:
    """The settings from `moe` (a model.moe ConfigDict), defaults where absent or
    for None; ConfigError for a flat key of older configs. Parts receive the result
    (built once, where the layer is built) instead of looking their settings up."""
    self.refuse_flat_keys(moe)
    return Settings(settings_of(moe, self.path, self.defaults))

  def refuse_flat_keys(self, cfg) -> None:
    """ConfigError for a flat key of older configs in a live `cfg` (it would be ignored)."""
    if cfg is None:
      return
    for old, key in self.legacy_keys:
      if old in cfg:
        raise ConfigError(
          f"model.moe.{old}={cfg[old]!r} is a flat key of older configs; "
          f"{self.what} reads model.moe.{self.path}.{key}"
        )

  def check(self, cfg) -> None:
    """ConfigError for unknown keys, old flat keys or bad values (`validate`)."""
    check_section(cfg, self.path, self.defaults, self.what)
    self.refuse_flat_keys(cfg)
    if self.validate is not None:
      self.validate(cfg)

  def add_defaults(self, moe) -> None:
    """Create model.moe.<path> at the defaults in the ConfigDict `moe`."""
    *parents, name = self.path.split(".")
    for part in parents:
      if part not in moe:
        moe[part] = ml_collections.ConfigDict()
      moe = moe[part]
    if name in moe:
      raise ValueError(f"{self.what}: model.moe.{self.path} already exists")
    moe[name] = ml_collections.ConfigDict(dict(self.defaults))

  def migrate(self, moe: dict) -> dict:
    """A stored model.moe dict with this part's flat legacy keys moved into its
    section (a value already in the section wins)."""
    moved = {key: moe[old] for old, key in self.legacy_keys if old in moe}
    if not moved:
      return moe
    moe = {k: v for k, v in moe.items() if k not in dict(self.legacy_keys)}
    *parents, name = self.path.split(".")
    node = moe
    for part in parents:
      node[part] = dict(node.get(part) or {})
      node = node[part]
    node[name] = {**moved, **(node.get(name) or {})}
    return moe


def import_package_modules(package_name: str, package_path) -> None:
  """Import every module of a package, so each file that registers a part
  registers it: adding a part is adding a file, with no list to edit."""
  for module in pkgutil.iter_modules(package_path):
    importlib.import_module(f"{package_name}.{module.name}")
