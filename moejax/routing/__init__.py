"""Routers: pure functions from float32 logits to a Routing (see base.py).

Importing this package registers every router; add a router by adding a file
here that calls `register_router` and importing it below.
"""
from moejax.routing.base import (ROUTERS, Routing, RouterOutput, RouterSpec,
                                 get_router, register_router)
from moejax.routing import expert_choice, sigmoid_bias, token_rounding, topk  # registers
from moejax.routing import (capacity_aware, mahalanobis, optimal_transport, probmoe,  # registers
                            sere, smooth_topk)
from moejax.routing import group_limited  # registers (DeepSeek-V3 group-limited top-k)
