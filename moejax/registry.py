"""Name -> implementation tables for the swappable parts (routers, expert types,
dispatch, grouped matmuls, losses).

A lookup of an unknown name raises a ConfigError that names the config key,
the bad value and every valid name. Tests iterate a registry (`items()`) to
check every registered part against one contract (tests/contract/), and
`temporarily` registers a part for the duration of a `with` block only.
"""
import contextlib
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
