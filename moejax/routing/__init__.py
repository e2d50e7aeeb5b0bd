"""Routers: pure functions from float32 logits and a RouterConfig to a Routing (see base.py).

Importing this package imports every module in it, so a router is one file
here that calls `register_router` (README, "Adding a router").
"""

from moejax.registry import import_package_modules
from moejax.routing.base import (
  ROUTERS,
  ROUTING,
  Routing,
  RouterConfig,
  RouterOutput,
  RouterSpec,
  call_router,
  get_router,
  register_router,
  router_config,
)

import_package_modules(__name__, __path__)

__all__ = [
  "ROUTERS",
  "ROUTING",
  "Routing",
  "RouterConfig",
  "RouterOutput",
  "RouterSpec",
  "call_router",
  "get_router",
  "register_router",
  "router_config",
]
