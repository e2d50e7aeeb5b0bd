"""Every registered router, in training and in evaluation: its Routing is well
formed (indices in range, distinct experts per token, finite weights, probs a
distribution, max_valid respected, its promises kept) and the default
dispatcher on that Routing equals the per-token loop (oracles.check_router)."""
import pytest

from moejax.routing import ROUTERS
from tests.contract.oracles import check_router


@pytest.mark.parametrize("router", list(ROUTERS))
def test_router_keeps_the_routing_contract(router):
  check_router(ROUTERS.get(router))
