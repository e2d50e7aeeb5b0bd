"""TMoW's prototype router (moejax/routing/prototype.py): a token equal to (a positive
multiple of) prototype d routes to d for every d, in the plain function, the
registered router and the MoE layer; logits are cos / tau by hand; the layer
trains the prototypes; bad tau, shapes and top_k are refused naming the value."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.config import base_config
from moejax.validation import validate_config
from moejax.errors import ConfigError
from moejax.layers.moe import MoELayer
from moejax.routing import call_router, get_router, router_config
from moejax.routing.prototype import cosine_logits, prototype_routing
from tests.helpers import moe_cfg

E, D = 6, 8


def prototypes(seed=0, e=E, d=D):
  return np.random.default_rng(seed).standard_normal((e, d)).astype(np.float32)


@pytest.mark.parametrize("scale", [1.0, 3.7, 0.01])
def test_a_token_equal_to_prototype_d_routes_to_d(scale):
  c = prototypes()
  routing, probs = prototype_routing(scale * c, c, tau=0.1, top_k=1)
  np.testing.assert_array_equal(np.asarray(routing.expert_index[:, 0]), np.arange(E))
  np.testing.assert_allclose(np.asarray(routing.combine_weight), 1.0)  # renormalised top-1
  assert (np.argmax(np.asarray(probs), axis=1) == np.arange(E)).all()


def test_the_registered_router_routes_prototype_d_to_d():
  spec = get_router("prototype")
  cfg = router_config(
    spec, moe_cfg(router="prototype", num_experts=E, top_k=2, prototype=dict(tau=0.2))
  )
  c = prototypes(1)
  logits = spec.projection.apply({"prototypes": jnp.asarray(c)}, jnp.asarray(2.0 * c), cfg)
  out = spec.route(logits, cfg=cfg, state={}, rng=None, train=True)
  np.testing.assert_array_equal(np.asarray(out.routing.expert_index[:, 0]), np.arange(E))
  np.testing.assert_allclose(np.diag(np.asarray(out.logits)), 1 / 0.2, rtol=1e-6)
  np.testing.assert_allclose(float(out.metrics["prototype_max_cosine"]), 1.0, rtol=1e-6)


def test_logits_are_cosines_over_tau_by_hand():
  z = np.array([[1.0, 0.0], [0.0, 0.0]], np.float32)  # the zero token: cosine 0 everywhere
  c = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]], np.float32)
  logits = np.asarray(cosine_logits(z, c, tau=0.5))
  np.testing.assert_allclose(
    logits, [[2.0, 0.0, -math.sqrt(2.0)], [0.0, 0.0, 0.0]], rtol=1e-6, atol=1e-7
  )
  assert logits.dtype == np.float32
  _, probs = prototype_routing(z, c, tau=0.5, top_k=3)
  e = np.exp([2.0, 0.0, -math.sqrt(2.0)])
  np.testing.assert_allclose(np.asarray(probs)[0], e / e.sum(), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(probs)[1], 1 / 3, rtol=1e-6)


def test_a_lower_tau_routes_more_sharply():
  z = np.random.default_rng(2).standard_normal((32, D)).astype(np.float32)
  c = prototypes(3)

  def entropy(tau):
    cfg = moe_cfg(router="prototype", num_experts=E, top_k=2, prototype=dict(tau=tau))
    return float(call_router("prototype", cosine_logits(z, c, tau), cfg).metrics["routing_entropy"])

  assert entropy(0.05) < entropy(0.5) < entropy(5.0) < math.log(E)


@pytest.mark.integration
def test_the_moe_layer_routes_prototypes_to_their_experts_and_trains_them():
  cfg = moe_cfg(router="prototype", num_experts=4, top_k=2, expert_d_ff=6, prototype=dict(tau=0.1))
  layer = MoELayer(D, cfg, rngs=nnx.Rngs(0), dtype=jnp.float32)
  c = prototypes(4, e=4)
  layer.router_projection["prototypes"].set_value(jnp.asarray(c))
  assert layer.router_kernel is None
  _, aux = layer(jnp.asarray(5.0 * c)[None], train=False)
  np.testing.assert_array_equal(np.asarray(aux["expert_index"][:, 0]), np.arange(4))

  x = jax.random.normal(jax.random.key(1), (2, 5, D))
  grads = nnx.grad(lambda m: jnp.sum(m(x, train=True, rng=jax.random.key(2))[0] ** 2))(layer)
  g = np.asarray(grads.router_projection["prototypes"][...])
  assert g.shape == (4, D) and np.isfinite(g).all() and np.abs(g).sum() > 0


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("inf"), True, "0.1"])
def test_bad_tau_is_refused_naming_the_value(tau):
  with pytest.raises(ConfigError, match=rf"tau={tau!r}"):
    cosine_logits(np.ones((2, 3)), np.ones((4, 3)), tau)


@pytest.mark.parametrize("tau", [0.0, -0.5])
def test_bad_config_tau_is_refused_naming_key_and_value(tau):
  c = base_config()
  c.model.moe.router = "prototype"
  c.model.moe.prototype.tau = tau
  with pytest.raises(ConfigError, match=rf"model\.moe\.prototype\.tau={tau}"):
    validate_config(c)
  c.model.moe.prototype.tau = 0.1
  validate_config(c)  # the defaults are valid


def test_bad_shapes_and_top_k_are_refused():
  c = np.ones((4, 3), np.float32)
  with pytest.raises(ConfigError, match=r"features shape \(2, 5\)"):
    cosine_logits(np.ones((2, 5)), c, 0.1)
  with pytest.raises(ConfigError, match=r"features shape \(3,\)"):
    cosine_logits(np.ones(3), c, 0.1)
  with pytest.raises(ConfigError, match=r"prototypes shape \(3,\)"):
    cosine_logits(np.ones((2, 3)), np.ones(3), 0.1)
  for k in (0, 5):
    with pytest.raises(ConfigError, match=rf"top_k={k} must be an integer in \[1, E=4\]"):
      prototype_routing(np.ones((2, 3)), c, 0.1, top_k=k)
