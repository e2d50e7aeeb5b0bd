"""SmoothSMoE: top-k routing made continuous near the top-k boundary (arXiv 2606.19036).

Read from the official code (thotranhuu99/Smooth_SMoE,
`our_tutel/tutel/gates/smooth_top.py` and `impls/moe_layer.py`, function
`smooth_routing`); this is an independent JAX implementation.

With logits g [T, E] and g_k the k-th largest logit of a token (no gradient):
    eta = softplus(eta_p)                         (eta_p learned, init -9)
    u_i = (g_i - g_k + eta) / eta                 (g_i without gradient)
    m_i = S(u_i),  S(u) = -inf          if u <= 0
                        = 0             if u >= 1
                        = -softplus(b log(1 - u) - a log u)  otherwise  (a=1, b=50)
    weights = softmax(g + m) over all E experts.
Experts with g_i >= g_k (the top-k) get m = 0; those within eta below the
boundary get a weight that goes continuously to 0 as g_i -> g_k - eta; the rest
are off. So the combine weights are a continuous function of the logits, where
hard top-k jumps when two logits cross. As eta -> 0 the weights become
softmax over the top-k logits, i.e. renormalised hard top-k. The number of
active experts per token is #{i : g_i > g_k - eta} (>= k).

Slots: S = E, sorted by weight; slot valid iff its weight is > 0 (an expert
inside the band). Invalid slots cost nothing in the dropless dispatch.
Departure (a bug moejax does not copy): the official dispatch
(`impls/fast_dispatch.py`, `extract_critical_smooth`, called with
top_k = E) scans the slots from the last down, finds the last slot j
(0-based) holding any positive gate and sets `actual_top_k = k` to j,
not j + 1, so it keeps slots [0, j) and drops the last occupied slot of
every token (with no expert inside the band, each token's k-th expert),
then renormalises the remaining gates (`normalize_gate`). moejax keeps
every slot with weight > 0.

Boundary loss (registered as "smooth_boundary"): the official
    L_b = alpha * eta * (X - (k + h)) * T,  X = mean_t #{i : g_it > g_kt - eta}
(X without gradient, alpha = 1, h = 0.5, T = the number of tokens in the
call, as the official `smooth_routing` multiplies by the token count). Its
gradient alpha * T * (X - k - h) on eta widens the band while fewer than
k + h experts are active on average and narrows it otherwise. The router
computes the term without alpha (it knows eta, k and h) as
`metrics["smooth_boundary_term"]`, and the loss multiplies it by its own
setting alpha (`model.moe.losses.smooth_boundary.alpha`, which reaches the loss
in its LossConfig; the router never reads it).

Loss weights. The official code returns L_b added to the balance loss as the
layer's auxiliary loss (`extract_critical_smooth` returns `l_loss + bd_loss`),
and the training scripts scale that sum by 0.01 (GMoE
`vision_transformer.py`: `aux_loss_weights = 0.01`; Language-Glue
`--aux_loss_weight` default 0.01). The moejax equivalent is
`model.moe.loss_weights.smooth_boundary = 1e-2` with
`model.moe.losses.smooth_boundary.alpha = 1`, beside `load_balance = 1e-2`
(configs/studies/routers.py). The router sweep used 1.0 (100x the official
scale) before it was corrected.

Balance loss: the official one (GMoE uses `is_gshard_loss=True`) is Tutel's
`gshard_loss(softmax(g), topk_ids)`, which counts only each token's top-1
expert (`top_ids[:, 0]`): E * sum_e f1_e * mean_t P_te with f1_e the fraction
of tokens whose top-1 is e. Its `set_load_balance`, which would count every
active expert, is defined in `gates/smooth_top.py` but never called.
moejax's "load_balance" loss (losses/balance.py) counts every valid slot,
i.e. every expert inside the band: a departure, small while ~k experts are
active, and the same across the router sweep's rows.

Micro-batches (train.micro_batches > 1): L_b scales with the tokens T of the
call, so M micro-batches of T/M tokens each give 1/M of the one-batch gradient
on eta; the router refuses micro-batching while the loss has a weight
(`accumulation_check`). The routing itself is per token and accumulates exactly.

Settings (model.moe.smooth_topk): eta_init, a, b, h_offset (defaults -9, 1,
50, 0.5, the official ones); the loss's alpha in model.moe.losses.smooth_boundary.

Trained eta: eta_p = `smooth_topk.eta_init` + eta_offset, where eta_offset (init 0)
is a trained router parameter (`init_params`): the MoE layer holds it as an
nnx.Param and passes it in `state`, so gradients reach it through both the
routing weights and the boundary loss, as in the paper.
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError
from moejax.losses.base import LossConfig, register_loss
from moejax.routing.base import (
  RouterConfig,
  RouterOutput,
  Routing,
  register_router,
  routing_entropy,
  top_k_slots,
)
from moejax.routing.topk import validate_top_k

OFF = -1e30  # logit of an expert outside the band (exp underflows to exactly 0)


def smooth_offsets(u: jax.Array, a: float, b: float) -> tuple[jax.Array, jax.Array]:
  """(m, active): S(u) with -inf replaced by 0 and reported through `active`."""
  active = u > 0
  uc = jnp.clip(u, 1e-6, 1.0 - 1e-6)
  inner = -jax.nn.softplus(b * jnp.log1p(-uc) - a * jnp.log(uc))
  m = jnp.where(u >= 1, 0.0, jnp.where(active, inner, 0.0))
  return m, active


def smooth_top_k_weights(
  logits: jax.Array, k: int, eta: jax.Array, a: float = 1.0, b: float = 50.0
):
  """Smoothed top-k combine weights over all experts.

  Returns (weights [T, E] summing to 1 per token, active bool [T, E],
  boundary logit g_k [T, 1]).
  """
  g_k = jax.lax.stop_gradient(jax.lax.top_k(logits, k)[0][:, -1:])
  u = (jax.lax.stop_gradient(logits) - g_k + eta) / eta
  m, active = smooth_offsets(u, a, b)
  scores = jnp.where(active, logits + m, OFF)
  return jax.nn.softmax(scores, axis=-1), active, g_k


def boundary_loss(logits, g_k, eta, k: int, alpha: float, h_offset: float):
  """alpha * eta * (mean #{g_i > g_k - eta} - (k + h)) * T  (official scaling by T)."""
  count = jnp.sum(jax.lax.stop_gradient(logits) > g_k - jax.lax.stop_gradient(eta), axis=-1).astype(
    jnp.float32
  )
  mean_active = jnp.mean(count)
  loss = alpha * eta * (mean_active - (k + h_offset)) * logits.shape[0]
  return loss, mean_active


def init_smooth_params(num_experts: int):
  del num_experts
  return {"eta_offset": jnp.zeros((), jnp.float32)}


# model.moe.smooth_topk (configs saved before the section had flat smooth_* keys).
SETTINGS = {"eta_init": -9.0, "a": 1.0, "b": 50.0, "h_offset": 0.5}
LEGACY_KEYS = {
  "smooth_eta_init": "eta_init",
  "smooth_a": "a",
  "smooth_b": "b",
  "smooth_h_offset": "h_offset",
}


def validate_keys(cfg: RouterConfig) -> None:
  """model.moe.smooth_topk: a, b > 0, h_offset >= 0 (whatever the router)."""
  s = cfg.settings
  for key in ("a", "b"):
    if s[key] <= 0:
      raise ConfigError(f"model.moe.smooth_topk.{key}={s[key]} must be > 0")
  if s["h_offset"] < 0:
    raise ConfigError(f"model.moe.smooth_topk.h_offset={s['h_offset']} must be >= 0")


def validate_loss_keys(cfg: LossConfig) -> None:
  """model.moe.losses.smooth_boundary: alpha >= 0."""
  alpha = cfg.settings["alpha"]
  if alpha < 0:
    raise ConfigError(f"model.moe.losses.smooth_boundary.alpha={alpha} must be >= 0")


def boundary_loss_accumulation(cfg: RouterConfig) -> str | None:
  """Why micro-batches would change the step (the boundary loss is scaled by T), or None."""
  if cfg.loss_weights.get("smooth_boundary", 0.0) > 0:
    return (
      "model.moe.loss_weights.smooth_boundary is scaled by the tokens of each call, "
      "so micro-batches would shrink it by train.micro_batches"
    )
  return None


@register_router(
  "smooth_topk",
  init_params=init_smooth_params,
  validate=validate_top_k,
  accumulation_check=boundary_loss_accumulation,
  settings=SETTINGS,
  legacy_keys=LEGACY_KEYS,
  validate_settings=validate_keys,
)
def route_smooth_top_k(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  del rng, train
  s = cfg.settings
  num_experts = logits.shape[-1]
  eta = jax.nn.softplus(s["eta_init"] + state["eta_offset"])
  weights, active, g_k = smooth_top_k_weights(logits, cfg.top_k, eta, s["a"], s["b"])
  weight, index = top_k_slots(weights, num_experts)
  valid = weight > 0
  routing = Routing(jnp.where(valid, index, 0), jnp.where(valid, weight, 0.0), valid)
  term, mean_active = boundary_loss(logits, g_k, eta, cfg.top_k, 1.0, s["h_offset"])
  probs = jax.nn.softmax(logits, axis=-1)
  metrics = {
    "routing_entropy": routing_entropy(probs),
    "smooth_eta": eta,
    "active_experts": mean_active,
    "smooth_boundary_term": term,
  }
  return RouterOutput(routing, logits, probs, metrics, state)


@register_loss(
  "smooth_boundary",
  settings={"alpha": 1.0},
  legacy_keys={"smooth_boundary_alpha": "alpha"},
  validate_settings=validate_loss_keys,
)
def smooth_boundary_loss(out: RouterOutput, cfg: LossConfig) -> jax.Array:
  """The SmoothSMoE boundary loss: its own alpha (cfg.settings) times the term the
  "smooth_topk" router computes."""
  if "smooth_boundary_term" not in out.metrics:
    raise ConfigError("model.moe.loss_weights.smooth_boundary needs model.moe.router='smooth_topk'")
  return cfg.settings["alpha"] * out.metrics["smooth_boundary_term"]
