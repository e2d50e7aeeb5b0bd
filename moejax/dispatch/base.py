"""Dispatch registry.

A dispatcher is a pure function
    (x [T, d], routing, expert_fn, cfg) -> (y [T, d], metrics)
where expert_fn(rows, matmul) applies the experts to rows grouped by expert
(see moejax/experts): the MoE layer passes BoundExperts, which also carry the
expert type's fused path, if it declares one (experts.base.experts_of).
`cfg` is the layer's MoE ConfigDict.

The sort every backend shares, the tile-padded row layout of the dropless
backends and the padding-waste figure are in moejax/assignment/layout.py.
"""

from collections.abc import Callable, Mapping
from typing import Any

import jax

from moejax.assignment.routing import Routing
from moejax.registry import Registry

# (x [T, d], routing, expert_fn, cfg) -> (y [T, d], metrics), as above.
Dispatcher = Callable[
  [jax.Array, Routing, Callable[..., jax.Array], Any], tuple[jax.Array, Mapping[str, jax.Array]]
]

DISPATCHERS: Registry[Dispatcher] = Registry("model.moe.dispatch")
register_dispatcher = DISPATCHERS.register
get_dispatcher = DISPATCHERS.get
