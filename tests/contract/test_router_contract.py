"""Every registered router, in training and in evaluation: its Routing is well
formed (indices in range, distinct experts per token, finite weights, probs a
distribution, max_valid respected, its promises kept) and the default
dispatcher on that Routing equals the per-token loop (oracles.check_router).

Every registered loss (here too: it reads the routers' outputs, computed once
per test worker): a finite float32 scalar on the training output of every
registered router it accepts (ConfigError for the others, at least one
accepted), a finite gradient, its step statistics (micro-batches given the
summed stats make the one-batch loss and gradient) and its declared
hand-worked example (oracles.check_loss)."""

import pytest

from moejax.losses import LOSSES
from moejax.losses.base import LOSS_EXAMPLES
from moejax.routing import ROUTERS
from tests.contract.oracles import check_loss, check_router, router_outputs


@pytest.mark.parametrize("router", list(ROUTERS))
def test_router_keeps_the_routing_contract(router):
  check_router(ROUTERS.get(router))


@pytest.mark.parametrize("loss", list(LOSSES))
def test_loss_keeps_the_loss_contract(loss):
  outputs = {f"{name} (train=True)": router_outputs(ROUTERS.get(name))[True] for name in ROUTERS}
  check_loss(loss, LOSSES.get(loss), outputs, LOSS_EXAMPLES.get(loss), LOSSES.get(loss).step_stats)


def test_balance_and_dpsl_declare_examples():
  assert {"load_balance", "z_loss", "dpsl"} <= set(LOSS_EXAMPLES)
