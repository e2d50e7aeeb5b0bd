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
from moejax.registry import Registry

DISPATCHERS = Registry("model.moe.dispatch")
register_dispatcher = DISPATCHERS.register
get_dispatcher = DISPATCHERS.get
