"""The MoE layer: router + experts + dispatch (+ losses), each chosen by name.

    x [B, L, d] -> router (float32) -> Routing -> dispatch(experts) -> y
                                    -> losses (weighted) + metrics
OmniMoE (Shi et al. 2026) is this layer with router=product_key (a router
that owns its projection), experts=atomic and one shared expert.

Shared experts (DeepSeekMoE, Dai et al. 2024) are one dense SwiGLU of width
shared.count * shared.d_ff that every token passes through; summing n shared
experts of width f is exactly one SwiGLU of width n * f. With shared.gate a
per-token sigmoid(x w_g) scales it (Qwen2-MoE). Settings: model.moe.shared (SHARED).

token_mask [B, L] (left-padded generation batches): padding tokens get
invalid slots, so they cost no expert compute and do not count in the load.

Under a mesh Layout (moejax/sharding.py) the routed experts run expert
parallel (dispatch/expert_parallel.py); the router and shared experts are
plain XLA SPMD over the same mesh.

The parts' configs are parsed once, when the layer is built: the router's
RouterConfig (routing/base.py), each loss's LossConfig (losses/base.py), the
expert type's and the merge rule's settings, and the routing section's
(model.moe.routing: the layer reads jitter and init_scale, routing/base.py).
They are frozen and hashable, so nnx keeps them as static attributes (in the
graph definition, beside the FrozenConfigDict `cfg`), out of the layer's state:
split/merge, jit, scan and checkpoints see the same arrays as before.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from moejax import dispatch, experts, losses, routing, sharding
from moejax.dispatch.expert_parallel import expert_parallel_dispatch
from moejax.errors import ConfigError
from moejax.experts import merged
from moejax.layers.dense import SwiGLU
from moejax.registry import PartSettings, check_number


# The values remat policy 'save_moe_routing' keeps (moejax/models/decoder.py).
ROUTING_NAMES = ("moe_router_logits", "moe_expert_index", "moe_combine_weight")

# Reported at every log step whatever their training weight.
DIAGNOSTIC_LOSSES = ("load_balance", "z_loss")
# Per-expert load fractions are logged up to this many experts (not N = 4096
# atomic experts); max_over_mean_load and distinct_experts always.
MAX_LOGGED_EXPERTS = 256


def validate_shared(cfg) -> None:
  s = SHARED.parse(cfg)
  check_number("model.moe.shared.count", s["count"], integer=True, strict=False)
  if s["count"]:
    check_number("model.moe.shared.d_ff", s["d_ff"], integer=True)
  if not isinstance(s["gate"], bool):
    raise ConfigError(f"model.moe.shared.gate={s['gate']!r} must be True or False")


# model.moe.shared: count shared experts of width d_ff (one SwiGLU of width
# count * d_ff; 0: none), gate: the Qwen2-MoE sigmoid gate (module doc).
SHARED = PartSettings(
  "shared",
  "the shared expert",
  (("count", 0), ("d_ff", 256), ("gate", False)),
  legacy_keys=(
    ("num_shared_experts", "count"),
    ("shared_d_ff", "d_ff"),
    ("shared_expert_gate", "gate"),
  ),
  validate=validate_shared,
)


class RouterState(nnx.Variable):
  """Non-trained router state (e.g. the aux-loss-free bias); not a Param."""


class RouterStats(nnx.Intermediate):
  """A router's accumulable statistics of one training call (RouterOutput.stats),
  sown as `router_stats` when the call runs under nnx.capture(..., RouterStats):
  the train step's micro-batching sums them (moejax/train/step.py)."""


def router_variables(spec, num_experts: int):
  """(trained params, non-trained state) a router declares, as nnx.Dicts or None."""
  params = (
    nnx.data(None)
    if spec.init_params is None
    else nnx.Dict({name: nnx.Param(v) for name, v in spec.init_params(num_experts).items()})
  )
  state = (
    nnx.data(None)
    if spec.init_state is None
    else nnx.Dict({name: RouterState(v) for name, v in spec.init_state(num_experts).items()})
  )
  return params, state


def variables(group) -> dict:
  """{name: Variable} of a router's nnx.Dict. Other entries are skipped, e.g. the
  `__captures__` that nnx.capture adds to every module it records."""
  return (
    {}
    if group is None
    else {name: var for name, var in group.items() if isinstance(var, nnx.Variable)}
  )


def router_inputs(params, state) -> dict:
  """The `state` dict a route call receives: router state and trained params."""
  return {
    name: var.get_value() for group in (state, params) for name, var in variables(group).items()
  }


def load_metrics(counts: jax.Array, tile: int, num_tokens: int | None = None) -> dict:
  """Load fraction per expert, max/mean load, and the padding waste of the
  dropless layout (padded rows / real rows at model.moe.dropless.tile), from
  assignment counts [E]; reported for every router and dispatch. With
  num_tokens also experts_per_token: kept assignments per token (top_k for
  top-k routing; lower when a router drops, variable under dynamic-k)."""
  waste = dispatch.padding_waste(counts, tile)
  counts = counts.astype(jnp.float32)
  total = jnp.maximum(jnp.sum(counts), 1.0)
  out = {
    "load_fraction": counts / total,
    "max_over_mean_load": jnp.max(counts) / jnp.maximum(jnp.mean(counts), 1e-9),
    "padding_waste": waste,
  }
  if num_tokens is not None:
    out["experts_per_token"] = jnp.sum(counts) / num_tokens
  return out


class MoELayer(nnx.Module):
  def __init__(self, d_model: int, cfg, *, rngs: nnx.Rngs, dtype, receives_base: bool = False):
    """receives_base: a NAMEx layer after the first (model.moe.merge='namex'), whose
    base expert the previous MoE layer passes on (`carry`): it builds none."""
    self.cfg = cfg
    self.dtype = dtype
    self.router_spec = routing.get_router(cfg.router)
    self.router_config = routing.router_config(self.router_spec, cfg)
    # model.moe.routing: the layer reads jitter and init_scale (routing/base.py).
    self.routing_settings = routing.ROUTING.parse(cfg)
    # A router without probs over all experts takes no loss (config validation).
    diagnostics = DIAGNOSTIC_LOSSES if self.router_spec.gives_probs else ()
    self.loss_configs = losses.loss_configs(sorted({*diagnostics, *cfg.loss_weights}), cfg)
    self.dispatcher = dispatch.get_dispatcher(cfg.dispatch)
    projection = self.router_spec.projection
    self.router_kernel = self.router_projection = nnx.data(None)
    if projection is None:
      # Small router init keeps early routing near uniform (ST-MoE sec. 3.2).
      self.router_kernel = nnx.Param(
        jax.nn.initializers.variance_scaling(
          self.routing_settings["init_scale"], "fan_in", "truncated_normal"
        )(rngs.params(), (d_model, cfg.num_experts), jnp.float32),
        logical_axes=("embed", None),
      )
    else:  # the router's own parameters (routing/base.py, RouterProjection)
      self.router_projection = nnx.Dict(
        {
          name: nnx.Param(value, logical_axes=projection.logical_axes[name])
          for name, value in projection.init(
            rngs.params(), d_model, cfg.num_experts, self.router_config
          ).items()
        }
      )
    self.router_params, self.router_state = router_variables(self.router_spec, cfg.num_experts)
    self.expert_type = experts.get_expert_type(cfg.get("experts", "swiglu"))
    self.expert_settings = self.expert_type.parse(cfg)
    self.experts = self.expert_type.build(cfg.num_experts, d_model, cfg, rngs=rngs)
    self.merge_rule = merged.rule_of(cfg)  # model.moe.merge (moejax/experts/merged.py)
    self.merge_settings = None if self.merge_rule is None else merged.SETTINGS.parse(cfg)
    self.merge_base = nnx.data(None)
    rule = self.merge_rule
    if rule is not None and rule.needs_base and not (rule.carries_base and receives_base):
      self.merge_base = self.expert_type.build(1, d_model, cfg, rngs=rngs)
    self.shared = nnx.data(None)
    self.shared_gate = nnx.data(None)
    shared = SHARED.parse(cfg)
    if shared["count"] > 0:
      self.shared = SwiGLU(d_model, shared["count"] * shared["d_ff"], rngs=rngs, dtype=dtype)
      if shared["gate"]:
        self.shared_gate = nnx.Param(
          jnp.zeros((d_model, 1), jnp.float32), logical_axes=("embed", None)
        )

  def __call__(
    self, x_BxLxD, *, token_mask=None, train: bool = False, rng=None, step_stats=None, carry=None
  ):
    """(y [B, L, d], aux): aux = {aux_loss, metrics, step_stats, and the Routing as
    expert_index, combine_weight, valid [T, S]} for analysis and parity tests.
    carry: NAMEx's base and momentum from the previous MoE layer (merged_call).

    step_stats {loss name: stats}: the step's statistics of the losses that declare
    them (moejax/losses/base.py), used instead of this call's; aux["step_stats"]
    holds this call's (gradient accumulation sums them, moejax/train/step.py)."""
    if self.merge_rule is not None:
      return self.merged_call(x_BxLxD, token_mask, carry)
    cfg = self.cfg
    b, length, d = x_BxLxD.shape
    x_TxD = sharding.constrain(x_BxLxD.reshape(b * length, d), ("batch", "act_embed"))
    # Router math runs in float32 at least, whatever the compute dtype.
    router_dtype = jnp.promote_types(jnp.float32, self.dtype)
    router_in = x_TxD.astype(router_dtype)
    jitter = self.routing_settings["jitter"]
    if train and jitter > 0:  # Switch Transformer sec. 2.4: noise on the router input
      rng, jitter_rng = jax.random.split(rng)
      router_in = router_in * jax.random.uniform(
        jitter_rng, router_in.shape, router_dtype, 1.0 - jitter, 1.0 + jitter
      )
    logits = checkpoint_name(self.router_logits(router_in), "moe_router_logits")
    out = self.router_spec.route(
      logits,
      cfg=self.router_config,
      rng=rng,
      train=train,
      state=router_inputs(self.router_params, self.router_state),
    )
    if self.router_state is not None and train:
      for name, var in variables(self.router_state).items():
        var.set_value(jax.lax.stop_gradient(out.state[name]))
      if out.stats and hasattr(self, "__captures__"):  # sown only under nnx.capture
        self.sow(RouterStats, "router_stats", dict(out.stats))

    assignment = dataclasses.replace(
      out.routing,
      expert_index=checkpoint_name(out.routing.expert_index, "moe_expert_index"),
      combine_weight=checkpoint_name(out.routing.combine_weight, "moe_combine_weight"),
    )
    if token_mask is not None:
      assignment = assignment.with_valid(assignment.valid & token_mask.reshape(b * length, 1))
    y_TxD, dispatch_metrics = self.dispatch(x_TxD.astype(self.dtype), assignment)
    if self.shared is not None:
      shared = self.shared(x_TxD)
      if self.shared_gate is not None:
        gate = x_TxD.astype(router_dtype) @ self.shared_gate[...].astype(router_dtype)
        shared = shared * jax.nn.sigmoid(gate).astype(shared.dtype)
      y_TxD = y_TxD + shared

    loss_values = {
      name: losses.loss_value(name, out, loss_cfg, step_stats)
      for name, loss_cfg in self.loss_configs.items()
    }
    aux_loss = sum(
      (cfg.loss_weights[name] * loss_values[name] for name in cfg.loss_weights),
      jnp.zeros((), jnp.float32),
    )
    counts = assignment.expert_counts(cfg.num_experts)
    metrics = {
      **out.metrics,
      **dispatch_metrics,
      **loss_values,
      **load_metrics(counts, cfg.dropless.tile, num_tokens=b * length),
      "distinct_experts": jnp.sum(counts > 0).astype(jnp.int32),
    }
    if cfg.num_experts > MAX_LOGGED_EXPERTS:  # [E] per layer per log step: too many
      metrics.pop("load_fraction")
    return self.gradient_probe(y_TxD.reshape(b, length, d)), {
      "aux_loss": aux_loss,
      "metrics": metrics,
      "step_stats": losses.step_stats_of(self.loss_configs, out),
      "expert_index": assignment.expert_index,
      "combine_weight": assignment.combine_weight,
      "valid": assignment.valid,
    }

  def gradient_probe(self, y_BxLxD):
    """y, plus the `output` perturbation when the call runs under
    nnx.capture(..., nnx.Perturbation): the gradient of a loss w.r.t. this layer's
    output (posttrain/taylor.py). Outside a capture it is y itself, untouched."""
    if not hasattr(self, "__captures__"):
      return y_BxLxD
    return self.perturb("output", y_BxLxD)

  def merged_call(self, x_BxLxD, token_mask=None, carry=None):
    """model.moe.merge: per segment, one expert merged from all under the previous
    segment's gates (moejax/experts/merged.py); (y, aux) as __call__. For NAMEx the
    base is carry["base"] (the layer's own base and zero momentum when carry is None,
    in the first MoE layer), and aux["carry"] is what the next MoE layer receives."""
    settings = self.merge_settings
    router_dtype = jnp.promote_types(jnp.float32, self.dtype)
    gates, _ = merged.segment_gates(
      x_BxLxD.astype(router_dtype), self.router_logits, settings["segment_len"], token_mask
    )
    base = (
      None
      if self.merge_base is None
      else {name: w[0] for name, w in self.merge_base.weights(self.dtype).items()}
    )
    if self.merge_rule.carries_base:
      if carry is None and base is None:
        raise ValueError(
          "model.moe.merge='namex': this MoE layer takes its base expert from the previous "
          "one (call the whole Decoder, which passes it on)"
        )
      carry = merged.initial_carry(base) if carry is None else carry
      base = carry["base"]
    expert = functools.partial(self.expert_type.expert, **self.expert_settings)
    expert_weights = self.experts.weights(self.dtype)
    y = merged.merged_forward(
      x_BxLxD.astype(self.dtype),
      gates,
      expert,
      expert_weights,
      base,
      self.merge_rule,
      settings["segment_len"],
      settings["eta"],
    )
    aux = merged.layer_aux(gates, x_BxLxD.shape[1], settings["segment_len"], token_mask)
    if self.merge_rule.carries_base:
      beta = merged.momentum_of(settings)
      aux["carry"] = merged.propagate(carry, expert_weights, settings["gamma"], beta)
    return self.gradient_probe(y), aux

  def router_logits(self, x_TxD):
    """What the router's `route` receives: x W, or its own projection of x."""
    if self.router_projection is None:
      return x_TxD @ self.router_kernel[...].astype(x_TxD.dtype)
    params = {
      name: var[...].astype(x_TxD.dtype) for name, var in variables(self.router_projection).items()
    }
    return self.router_spec.projection.apply(params, x_TxD, self.router_config)

  def dispatch(self, x_TxD, assignment):
    """The configured dispatcher; across the mesh (expert parallel) under a Layout."""
    bound = self.expert_type.bind(self.experts.weights(self.dtype), self.expert_settings)
    layout = sharding.current_layout()
    if layout is None:
      return self.dispatcher(x_TxD, assignment, bound, self.cfg)
    return expert_parallel_dispatch(
      x_TxD, assignment, bound.weights, bound.type.logical_axes, bound.apply, self.cfg, layout
    )
