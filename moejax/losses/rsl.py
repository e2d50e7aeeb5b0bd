"""Routing Specialization Loss, RSL (LoRA-Mixer, arXiv 2507.00029v2).

The paper's code is not released; this form is our guess at its description
("balanced expert usage, low per-token routing entropy, high entropy of the
mean routing distribution"):

    RSL = w_b * E * sum_i f_i Pbar_i  +  w_s * mean_t H(p_t)  -  w_m * H(Pbar)

  f_i      fraction of the valid assignments routed to expert i (not differentiated;
           the Switch load-balance term, moejax/losses/balance.py)
  Pbar     the mean router distribution over the call's tokens
  H        entropy in nats; H(p_t) low = each token picks its experts decisively,
           H(Pbar) high = all experts used
The weights w_b, w_s, w_m are model.moe.losses.rsl.{balance_weight,
token_entropy_weight, marginal_entropy_weight} (all 1.0 by default). The paper
adapts its weights during training; here they are fixed (a guess as well).

With one-hot token distributions and a uniform marginal, RSL = w_b - w_m log E,
its minimum (tests/losses/test_rsl.py checks it by brute force over a grid).
H(Pbar) is a statistic of the whole call's tokens, so gradient accumulation
with train.balance_statistics='step' refuses RSL (moejax/losses/base.py).
"""

import math

import jax
import jax.numpy as jnp

from moejax.assignment.routing import RouterOutput, Routing, routing_entropy
from moejax.errors import ConfigError
from moejax.losses.balance import load_balance_loss
from moejax.losses.base import LossConfig, register_loss
from moejax.registry import Settings

WEIGHTS = ("balance_weight", "token_entropy_weight", "marginal_entropy_weight")


def rsl_terms(out: RouterOutput) -> dict:
  """The three unweighted terms: balance (E sum f P), token_entropy (mean_t H(p_t)) and
  marginal_entropy (H(Pbar)), float32 scalars."""
  probs = out.over_experts("probs")
  return {
    "balance": load_balance_loss(out),
    "token_entropy": routing_entropy(probs),
    "marginal_entropy": routing_entropy(jnp.mean(probs, axis=0, keepdims=True)),
  }


def rsl_example():
  """E = 2, top-1: token 0 has p = (1, 0) and goes to expert 0, token 1 has p = (1/2,
  1/2) and goes to expert 1. f = (1/2, 1/2), Pbar = (3/4, 1/4): balance 2 (3/8 + 1/8)
  = 1; mean token entropy (0 + log 2) / 2; H(Pbar) = 2 log 2 - (3/4) log 3. With
  weights 1: RSL = 1 - (3/2) log 2 + (3/4) log 3."""
  probs = jnp.asarray([[1.0, 0.0], [0.5, 0.5]], jnp.float32)
  routing = Routing(jnp.asarray([[0], [1]], jnp.int32), jnp.ones((2, 1)), jnp.ones((2, 1), bool))
  out = RouterOutput(routing, jnp.log(jnp.maximum(probs, 1e-30)), probs, {}, {})
  cfg = LossConfig(Settings(dict.fromkeys(WEIGHTS, 1.0)))
  return out, cfg, 1.0 - 1.5 * math.log(2.0) + 0.75 * math.log(3.0)


def validate_weights(cfg: LossConfig) -> None:
  """model.moe.losses.rsl: every weight >= 0."""
  for key, value in cfg.settings.items():
    if not value >= 0:
      raise ConfigError(f"model.moe.losses.rsl.{key}={value} must be >= 0")


@register_loss(
  "rsl",
  example=rsl_example,
  settings=dict.fromkeys(WEIGHTS, 1.0),
  validate_settings=validate_weights,
  batch_statistic="the entropy of the mean routing distribution over a call's tokens "
  "is not a sum over micro-batches",
)
def rsl(out: RouterOutput, cfg: LossConfig) -> jax.Array:
  """RSL (module doc) with the weights of model.moe.losses.rsl (cfg.settings)."""
  w = cfg.settings
  terms = rsl_terms(out)
  return (
    w["balance_weight"] * terms["balance"]
    + w["token_entropy_weight"] * terms["token_entropy"]
    - w["marginal_entropy_weight"] * terms["marginal_entropy"]
  )
