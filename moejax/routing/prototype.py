"""Prototype (cosine) routing of TMoW, the Test-time Mixture of World Models
(Jang et al., ICLR 2026; arXiv 2601.22647; abstract and a README excerpt only).

Each expert e holds a prototype c_e (a domain's mean feature in TMoW) and a
token's routing distribution is the softmax of its cosine similarity to every
prototype, sharpened by a temperature tau (the spec's w_{d,l}):
    logits[t, e] = cos(x_t, c_e) / tau = <x_t / |x_t|, c_e / |c_e|> / tau
    probs = softmax(logits), then the top_k experts by probs (topk.py),
renormalised when model.moe.routing.renormalize. The paper routes each layer l of a
GCN encoder of the observation against its own prototypes c_{d,l}; a moejax MoE
layer routes its own input, so one prototype set per layer plays that role.

Registered as router 'prototype' with its own projection (RouterProjection in
base.py): the prototypes [E, d] are the router's trained parameters (in place
of the kernel W [d, E]) and `route` receives cos / tau. Guesses, marked:
  * tau: model.moe.prototype.tau, default 0.1 (GUESS; the paper's value is not
    known). Logits are then bounded: |logits| <= 1 / tau.
  * normalisation: a zero token (or prototype) has cosine 0 with everything
    (norms are floored at 1e-12), so it routes uniformly before top-k.
  * initialisation: prototypes ~ N(0, 1/d) (GUESS; cosine routing is
    invariant to their scale, and TMoW sets them to mean domain features).
Router math is float32 (the cosine matmul at HIGHEST precision).

`cosine_logits` and `prototype_routing` are the same math as plain functions
for code outside the MoE layer (moejax/online/tmow.py); they refuse a bad tau
or mismatched shapes with a ConfigError naming the value.
"""

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError
from moejax.routing.base import (
  RouterConfig,
  RouterOutput,
  RouterProjection,
  register_router,
  routing_entropy,
)
from moejax.routing.topk import softmax_top_k, validate_top_k

SETTINGS = {"tau": 0.1}  # model.moe.prototype; GUESS (module doc)
_TINY = 1e-12


def check_tau(tau, where: str = "tau") -> None:
  """ConfigError unless tau is a finite number > 0 (a traced value passes)."""
  if isinstance(tau, jax.core.Tracer):
    return
  ok = not isinstance(tau, (bool, np.bool_, str, bytes)) and np.ndim(tau) == 0
  try:
    ok = ok and math.isfinite(float(tau)) and float(tau) > 0
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ConfigError(f"{where}={tau!r} must be a finite number > 0 (the cosine temperature)")


def unit_rows(a: jax.Array) -> jax.Array:
  """Each row of a [..., F] divided by its norm (floored at 1e-12), float32."""
  a = jnp.asarray(a, jnp.float32)
  return a / jnp.maximum(jnp.linalg.norm(a, axis=-1, keepdims=True), _TINY)


def cosine_logits(z, prototypes, tau) -> jax.Array:
  """cos(z_t, c_e) / tau, float32 [T, E], for z [T, F] and prototypes [E, F]."""
  check_tau(tau)
  z_shape, c_shape = np.shape(z), np.shape(prototypes)
  if len(c_shape) != 2 or c_shape[0] < 1:
    raise ConfigError(f"prototypes must be [E, F] with E >= 1 (prototypes shape {c_shape})")
  if len(z_shape) != 2 or z_shape[1] != c_shape[1]:
    raise ConfigError(
      f"features must be [T, F={c_shape[1]}] like the prototypes "
      f"(features shape {z_shape}, prototypes shape {c_shape})"
    )
  cos = jnp.einsum(
    "tf,ef->te", unit_rows(z), unit_rows(prototypes), precision=jax.lax.Precision.HIGHEST
  )
  return cos / jnp.asarray(tau, jnp.float32)


def prototype_routing(z, prototypes, tau, top_k: int, renormalize: bool = True):
  """(Routing, probs [T, E]): the router's top_k of softmax(cos / tau)."""
  num_experts = np.shape(prototypes)[0] if np.ndim(prototypes) == 2 else 0
  if (
    isinstance(top_k, bool)
    or not isinstance(top_k, (int, np.integer))
    or not (1 <= top_k <= max(num_experts, 1))
  ):
    raise ConfigError(f"top_k={top_k!r} must be an integer in [1, E={num_experts}]")
  return softmax_top_k(cosine_logits(z, prototypes, tau), top_k, renormalize)


def validate_settings(cfg: RouterConfig) -> None:
  """model.moe.prototype.tau must be finite and > 0 (checked whatever the router)."""
  check_tau(cfg.settings["tau"], where="model.moe.prototype.tau")


def init_prototypes(key, d_model: int, num_experts: int, cfg: RouterConfig) -> dict:
  """Prototypes [E, d] ~ N(0, 1/d) (a GUESS; the module doc)."""
  del cfg
  scale = 1.0 / math.sqrt(d_model)
  return {"prototypes": scale * jax.random.normal(key, (num_experts, d_model), jnp.float32)}


def project(params, x, cfg: RouterConfig) -> jax.Array:
  """What `route` receives: cos(x, prototypes) / tau [T, E], float32."""
  return cosine_logits(jnp.asarray(x, jnp.float32), params["prototypes"], cfg.settings["tau"])


@register_router(
  "prototype",
  validate=validate_top_k,
  settings=SETTINGS,
  validate_settings=validate_settings,
  promises={"weights_proportional_to_probs"},
  projection=RouterProjection(init_prototypes, {"prototypes": (None, "embed")}, project),
)
def route_prototype(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  """Top-k of softmax(cos / tau) (the module doc); logits = the projection's cos / tau."""
  del rng, train
  routing, probs = softmax_top_k(logits, cfg.top_k, cfg.renormalize)
  metrics = {
    "routing_entropy": routing_entropy(probs),
    "prototype_max_cosine": jnp.mean(jnp.max(logits, axis=-1)) * cfg.settings["tau"],
  }
  return RouterOutput(routing, logits, probs, metrics, state)
