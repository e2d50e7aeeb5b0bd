"""model.moe.routing: the routing keys routers share (moejax/routing/base.py, ROUTING).
Routers read them from their RouterConfig, the MoE layer reads jitter and init_scale,
and a bad value is refused in one line naming model.moe.routing.<key>."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from ml_collections import ConfigDict

from moejax.config import base_config
from moejax.errors import ConfigError
from moejax.layers.moe import MoELayer
from moejax.routing import ROUTING, router_config
from moejax.validation import validate_config
from tests.helpers import moe_cfg

BAD = {
  "renormalize": [1, "yes"],
  "routed_scaling_factor": [0.0, -1.0],
  "bias_update_rate": [-1e-3],
  "num_groups": [0, 1.5],
  "topk_groups": [0],
  "jitter": [-0.1, 1.0],
  "init_scale": [0.0, float("nan")],
}


def test_every_key_has_bad_values():
  assert set(BAD) == {key for key, _ in ROUTING.defaults}


@pytest.mark.parametrize("key,value", [(k, v) for k, values in BAD.items() for v in values])
def test_a_bad_value_is_refused_naming_its_key(key, value):
  stored = base_config().to_dict()  # a stored config: values of any type
  stored["model"]["moe"]["routing"][key] = value
  with pytest.raises(ConfigError) as error:
    validate_config(ConfigDict(stored))
  message = str(error.value)
  assert message.startswith(f"model.moe.routing.{key}={value!r}"), message
  assert "\n" not in message


def test_routers_read_the_section():
  cfg = moe_cfg(routing={"renormalize": False, "num_groups": 4, "routed_scaling_factor": 2.5})
  rc = router_config("topk", cfg)
  assert (rc.renormalize, rc.num_groups, rc.routed_scaling_factor) == (False, 4, 2.5)


def test_the_layer_reads_jitter_and_init_scale():
  def layer(**routing):
    return MoELayer(16, moe_cfg(routing=routing), rngs=nnx.Rngs(0), dtype=jnp.float32)

  small, large = layer(init_scale=0.01), layer(init_scale=1.0)
  ratio = np.std(large.router_kernel[...]) / np.std(small.router_kernel[...])
  np.testing.assert_allclose(ratio, 10.0, rtol=1e-5)  # std ~ sqrt(scale), same draw

  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 8, 16)), jnp.float32)
  rng = jax.random.key(1)
  plain, jittered = layer(), layer(jitter=0.5)
  _, aux = plain(x, train=True, rng=rng)
  _, aux_jittered = jittered(x, train=True, rng=rng)
  assert not np.array_equal(aux["combine_weight"], aux_jittered["combine_weight"])
  _, aux_eval = jittered(x, train=False, rng=rng)  # no jitter outside training
  np.testing.assert_array_equal(aux_eval["combine_weight"], plain(x, rng=rng)[1]["combine_weight"])
