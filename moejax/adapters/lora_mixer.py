"""LoRA-Mixer (arXiv 2507.00029v2): token-routed LoRA experts on the attention
projections, model.attention.adapter='lora_mixer' (settings model.attention.lora_mixer).

Each adapted projection (q, k, v, o; `projections`) becomes (sec. 3, eq. 1)

    y = W x + scale * sum_{i in topk(p)} g_i B_i A_i x,      p = softmax(W_r x)

with E = num_experts LoRA experts of rank r (A_i [d_in, r], B_i [r, d_out]) and a
token router W_r [d_in, E] per projection. B starts at 0, so at initialisation
(and whenever B = 0) the model is its base exactly.

Hard-soft routing (a guess: the paper's code is not released): the straight-through
gate g = hard + p - stop_gradient(p), hard = 1/k on the k experts with the highest
p (ties to the lower index), 0 elsewhere. The forward pass is the hard routing
exactly; the router's gradient is the soft one, reaching every expert's p (all E
LoRA terms are computed: E r (d_in + d_out) per token, small at LoRA ranks).

Router losses: any registered loss (moejax/losses/) on the router's RouterOutput,
weighted by `loss_weights` ({name: weight}; 'rsl' is the paper's Routing
Specialization Loss, moejax/losses/rsl.py, whose own settings stay in
model.moe.losses.rsl); the weighted sum over projections and layers joins the
model's aux_loss. The paper's two regimes: train.trainable='adapter' (base frozen,
LoRAs and routers trained) and 'adapter_router' (LoRAs frozen, routers trained).
A single LoRA of rank R is num_experts=1, top_k=1, rank=R (its gate is always 1).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax import losses
from moejax.adapters.projection import (
  PROJECTION_ADAPTERS,
  ProjectionAdapterSpec,
  adapted_projections,
  projection_dims,
)
from moejax.assignment.routing import RouterOutput, Routing
from moejax.errors import ConfigError, choice_error
from moejax.registry import Settings
from moejax.routing.topk import softmax_top_k

SETTINGS = {
  "num_experts": 4,
  "top_k": 1,
  "rank": 4,
  "scale": 1.0,  # multiplies the LoRA term (no alpha / r)
  "projections": "q,k,v,o",
  "router_init_scale": 0.1,  # variance scale of W_r: near-uniform routing at init
  "loss_weights": {"rsl": 1e-2},
}


def straight_through_gates(out: RouterOutput) -> jax.Array:
  """g [T, E] = hard + (p - stop_gradient(p)): the hard routing's weights forward, exactly
  (each valid slot's combine weight on its expert; p - p is 0), the softmax's gradient
  backward."""
  probs = out.over_experts("probs")
  slots = jax.nn.one_hot(out.routing.expert_index, probs.shape[-1], dtype=probs.dtype)
  hard = jnp.einsum("tse,ts->te", slots, out.routing.masked_weight().astype(probs.dtype))
  return hard + (probs - jax.lax.stop_gradient(probs))


class LoRAMixer(nnx.Module):
  """The LoRA-Mixer term of one projection (module doc): call (x [B, L, d_in],
  token_mask [B, L] or None) -> (term [B, L, d_out], aux)."""

  def __init__(self, d_in: int, d_out: int, axes, settings: dict, m, *, rngs, dtype):
    e, r = settings["num_experts"], settings["rank"]
    in_axis, out_axis = axes
    # A as LoRA's fan-in draw (one per expert), B zero (Hu et al. 2021, sec. 4.1).
    draw_a = jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", batch_axis=0)
    self.lora_a = nnx.Param(
      draw_a(rngs.params(), (e, d_in, r), jnp.float32), logical_axes=(None, in_axis, None)
    )
    self.lora_b = nnx.Param(
      jnp.zeros((e, r, d_out), jnp.float32), logical_axes=(None, None, out_axis)
    )
    draw_router = jax.nn.initializers.variance_scaling(
      settings["router_init_scale"], "fan_in", "truncated_normal"
    )
    self.router_kernel = nnx.Param(
      draw_router(rngs.params(), (d_in, e), jnp.float32), logical_axes=(in_axis, None)
    )
    self.top_k, self.scale, self.dtype = settings["top_k"], settings["scale"], dtype
    # A Settings (hashable), not a dict: the module's graph definition stays hashable, so
    # a jitted step can take it as a static argument (moejax/continual/bayesian_vqa.py).
    self.loss_weights = Settings(settings["loss_weights"])
    # Each loss's LossConfig, from its own settings in model.moe.losses.<name>.
    self.loss_configs = losses.loss_configs(self.loss_weights, m.moe)

  def route(self, x_TxD, valid_T=None) -> RouterOutput:
    """Top-k of softmax(x W_r) in float32, combine weight 1/k per slot (the hard gate)."""
    logits = x_TxD.astype(jnp.float32) @ self.router_kernel[...]
    routing, probs = softmax_top_k(logits, self.top_k, renormalize=False)
    valid = routing.valid if valid_T is None else routing.valid & valid_T[:, None]
    routing = Routing(routing.expert_index, jnp.full(valid.shape, 1.0 / self.top_k), valid)
    return RouterOutput(routing, logits, probs, {}, {})

  def __call__(self, x_BxLxD, token_mask_BxL=None):
    b, length, d = x_BxLxD.shape
    x_TxD = x_BxLxD.reshape(b * length, d)
    valid = None if token_mask_BxL is None else token_mask_BxL.reshape(-1).astype(bool)
    out = self.route(x_TxD, valid)
    gates = straight_through_gates(out).astype(self.dtype)
    a, b_ = self.lora_a[...].astype(self.dtype), self.lora_b[...].astype(self.dtype)
    low = jnp.einsum("td,edr->ter", x_TxD.astype(self.dtype), a) * gates[..., None]
    term = self.scale * jnp.einsum("ter,erf->tf", low, b_)
    values = {
      name: losses.loss_value(name, out, self.loss_configs[name]) for name in self.loss_weights
    }
    aux_loss = sum(
      (w * values[name] for name, w in self.loss_weights.items()), jnp.zeros((), jnp.float32)
    )
    aux = {
      "aux_loss": aux_loss,
      "metrics": values,
      "expert_index": out.routing.expert_index,
      "valid": out.routing.valid,
    }
    return term.reshape(b, length, -1), aux


def validate(settings: dict, m) -> None:
  """ConfigError naming model.attention.lora_mixer.<key> for a value it cannot use."""
  key = "model.attention.lora_mixer"
  for name in ("num_experts", "rank", "top_k"):
    value = settings[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f"{key}.{name}={value!r} must be an int >= 1")
  if settings["top_k"] > settings["num_experts"]:
    raise ConfigError(
      f"{key}.top_k={settings['top_k']} exceeds {key}.num_experts={settings['num_experts']}"
    )
  dims = projection_dims(m)
  limit = min(min(dims[p]) for p in adapted_projections(settings))
  if settings["rank"] > limit:
    raise ConfigError(
      f"{key}.rank={settings['rank']} exceeds {limit}, the smallest dimension of the "
      "adapted projections"
    )
  for name in ("scale", "router_init_scale"):
    if not isinstance(settings[name], (int, float)) or not settings[name] > 0:
      raise ConfigError(f"{key}.{name}={settings[name]!r} must be > 0")
  for name, weight in settings["loss_weights"].items():
    if name not in losses.LOSSES:
      raise choice_error(f"{key}.loss_weights", name, losses.LOSSES)
    if not weight >= 0:
      raise ConfigError(f"{key}.loss_weights.{name}={weight} must be >= 0")
    losses.get_loss(name).config_section.check(m.moe)


PROJECTION_ADAPTERS.add(
  "lora_mixer", ProjectionAdapterSpec(LoRAMixer, tuple(SETTINGS.items()), validate)
)
