"""Name -> implementation tables for the swappable parts (routers, dispatch, losses).

A lookup of an unknown name raises a ConfigError that names the config key,
the bad value and every valid name.
"""
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

  def get(self, name: str) -> T:
    if name not in self._items:
      raise choice_error(self.config_key, name, self._items)
    return self._items[name]

  def __contains__(self, name) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(self._items)

  def __len__(self) -> int:
    return len(self._items)
