"""Name -> implementation tables for the swappable parts (routers, expert types,
dispatch, grouped matmuls, losses).

A lookup of an unknown name raises a ConfigError that names the config key,
the bad value and every valid name. Tests iterate a registry (`items()`) to
check every registered part against one contract (tests/contract/), and
`temporarily` registers a part for the duration of a `with` block only.
"""
import contextlib
import importlib
import pkgutil
from typing import Callable, Generic, Iterator, TypeVar

from moejax.errors import choice_error

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


# A part's own settings (routers, expert types): declared defaults, held in the
# config section model.moe.<part name>, which config.base_config builds from the
# registries, so adding a part needs no edit of config.py.

def settings_of(cfg, name: str, defaults) -> dict:
  """The part's settings: `cfg.<name>` over its declared defaults (a default
  wherever the section or a key is missing, e.g. a hand-built cfg)."""
  section = None if cfg is None else cfg.get(name)
  return {key: (default if section is None else section.get(key, default))
          for key, default in dict(defaults).items()}


def check_section(cfg, name: str, defaults, what: str) -> None:
  """ConfigError if model.moe.<name> holds keys `what` does not declare."""
  from moejax.errors import ConfigError
  section = cfg.get(name)
  if section is None:
    return
  unknown = set(section) - set(dict(defaults))
  if unknown:
    raise ConfigError(f"model.moe.{name} has unknown keys {sorted(unknown)}; {what} has "
                      f"settings {sorted(dict(defaults))}")


def import_package_modules(package_name: str, package_path) -> None:
  """Import every module of a package, so each file that registers a part
  registers it: adding a part is adding a file, with no list to edit."""
  for module in pkgutil.iter_modules(package_path):
    importlib.import_module(f"{package_name}.{module.name}")
