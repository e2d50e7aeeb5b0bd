"""Every registered router, in training and in evaluation: its Routing is well
formed (indices in range, distinct experts per token, finite weights, probs a
distribution, max_valid respected, its promises kept) and the default
dispatcher on that Routing equals the per-token loop (oracles.check_router).

Every registered loss (here too: it reads the routers' outputs, computed once
per test worker): a finite float32 scalar on the training output of every
registered router it accepts (ConfigError for the others, at least one
accepted), a finite gradient, its step statistics (micro-batches given the
summed stats make the one-batch loss and gradient) and its declared
hand-worked example (oracles.check_loss).

Both receive their parsed config (RouterConfig, LossConfig), built once; called
with the model.moe ConfigDict itself, they refuse it."""

import jax.numpy as jnp
import pytest

from moejax.losses import LOSSES, loss_config
from moejax.losses.base import LOSS_EXAMPLES
from moejax.routing import ROUTERS, router_config
from tests.contract.router_oracles import E_R, check_loss, check_router, router_cfg, router_outputs


@pytest.mark.parametrize("router", list(ROUTERS))
def test_router_keeps_the_routing_contract(router):
  check_router(ROUTERS.get(router))


@pytest.mark.parametrize("loss", list(LOSSES))
def test_loss_keeps_the_loss_contract(loss):
  outputs = {f"{name} (train=True)": router_outputs(ROUTERS.get(name))[True] for name in ROUTERS}
  check_loss(loss, LOSSES.get(loss), outputs, LOSS_EXAMPLES.get(loss), LOSSES.get(loss).step_stats)


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_router_refuses_the_moe_config_dict(router):
  spec, moe = ROUTERS.get(router), router_cfg(router)
  with pytest.raises(TypeError, match=rf"router '{router}' takes a RouterConfig"):
    spec.route(jnp.zeros((4, E_R)), cfg=moe, state=spec.initial_state(E_R), rng=None, train=False)
  config = router_config(spec, moe)  # frozen, hashable, equal when built again
  assert config == router_config(spec, moe) and hash(config) == hash(router_config(spec, moe))
  assert config.settings == spec.config_section.parse(moe)
  assert (config.top_k, config.num_experts) == (moe.top_k, moe.num_experts)


@pytest.mark.parametrize("loss", list(LOSSES))
def test_a_loss_refuses_the_moe_config_dict(loss):
  out = router_outputs(ROUTERS.get("topk"))[True]
  with pytest.raises(TypeError, match=rf"loss '{loss}' takes a LossConfig"):
    LOSSES.get(loss)(out, router_cfg("topk"))
  config = loss_config(loss, router_cfg("topk"))
  assert hash(config) == hash(loss_config(loss, router_cfg("topk")))


def test_balance_and_dpsl_declare_examples():
  assert {"load_balance", "z_loss", "dpsl"} <= set(LOSS_EXAMPLES)
