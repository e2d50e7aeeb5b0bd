"""Dispatch registry.

A dispatcher is a pure function
    (x [T, d], routing, expert_fn, cfg) -> (y [T, d], metrics)
where expert_fn(rows, matmul) applies the experts to rows grouped by expert
(see moejax/experts): the MoE layer passes BoundExperts, which also carry the
expert type's fused path, if it declares one (experts.base.experts_of).
`cfg` is the layer's MoE ConfigDict.

A registered dispatcher (DispatcherSpec) also declares
  settings  its settings section (registry.PartSettings: model.moe.dropless,
            model.moe.capacity), or None;
  drops     which assignments it may leave out: DROPS_NOTHING (every valid slot
            counts), or CAPACITY_DROPS (GShard: per expert, the assignments past its
            capacity C in slot-major, then token, order contribute nothing;
            capacity.py). tests/contract/ checks each against its own oracle.

The sort every backend shares, the tile-padded row layout of the dropless
backends and the padding-waste figure are in moejax/assignment/layout.py.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

from moejax.assignment.routing import Routing
from moejax.registry import PartSettings, Registry

# (x [T, d], routing, expert_fn, cfg) -> (y [T, d], metrics), as above.
Dispatcher = Callable[
  [jax.Array, Routing, Callable[..., jax.Array], Any], tuple[jax.Array, Mapping[str, jax.Array]]
]

DROPS_NOTHING = "nothing"
CAPACITY_DROPS = "past_capacity"
DROP_RULES = (DROPS_NOTHING, CAPACITY_DROPS)


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity (static in nnx)
class DispatcherSpec:
  """A registered dispatcher: called as the function it wraps (module doc)."""

  name: str
  fn: Dispatcher
  settings: PartSettings | None = None
  drops: str = DROPS_NOTHING

  def __post_init__(self):
    if self.drops not in DROP_RULES:
      raise ValueError(f"dispatcher {self.name!r}: drops={self.drops!r} not in {DROP_RULES}")

  def __call__(self, x, routing, expert_fn, cfg):
    return self.fn(x, routing, expert_fn, cfg)


DISPATCHERS: Registry[DispatcherSpec] = Registry("model.moe.dispatch")
get_dispatcher = DISPATCHERS.get


def register_dispatcher(
  name: str, *, settings: PartSettings | None = None, drops: str = DROPS_NOTHING
) -> Callable[[Dispatcher], Dispatcher]:
  """Decorator: register a dispatch function under `name` (see DispatcherSpec); the
  function itself is returned unchanged."""

  def wrap(fn: Dispatcher) -> Dispatcher:
    DISPATCHERS.add(name, DispatcherSpec(name, fn, settings, drops))
    return fn

  return wrap
