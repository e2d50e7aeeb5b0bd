"""The MoE layer: router + experts + dispatch (+ losses), each chosen by name.

    x [B, L, d] -> router (float32) -> Routing -> dispatch(experts) -> y
                                    -> losses (weighted) + metrics
Shared experts (DeepSeekMoE, Dai et al. 2024) are one dense SwiGLU of width
num_shared_experts * shared_d_ff that every token passes through; summing
n shared experts of width f is exactly one SwiGLU of width n * f.
"""
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from moejax import dispatch, losses, routing
from moejax.experts import SwiGLUExperts, swiglu_experts
from moejax.layers.dense import SwiGLU


# Reported at every log step whatever their training weight.
DIAGNOSTIC_LOSSES = ("load_balance", "z_loss")


class RouterState(nnx.Variable):
  """Non-trained router state (e.g. the aux-loss-free bias); not a Param."""


def load_metrics(counts: jax.Array) -> dict:
  """Load fraction per expert and max/mean load from assignment counts [E]."""
  counts = counts.astype(jnp.float32)
  total = jnp.maximum(jnp.sum(counts), 1.0)
  return {"load_fraction": counts / total,
          "max_over_mean_load": jnp.max(counts) / jnp.maximum(jnp.mean(counts), 1e-9)}


class MoELayer(nnx.Module):

  def __init__(self, d_model: int, cfg, *, rngs: nnx.Rngs, dtype):
    self.cfg = cfg
    self.dtype = dtype
    self.router_spec = routing.get_router(cfg.router)
    self.dispatcher = dispatch.get_dispatcher(cfg.dispatch)
    # Small router init keeps early routing near uniform (ST-MoE sec. 3.2).
    self.router_kernel = nnx.Param(jax.nn.initializers.variance_scaling(
        cfg.router_init_scale, "fan_in", "truncated_normal")(
            rngs.params(), (d_model, cfg.num_experts), jnp.float32))
    self.router_state = nnx.data(None)
    if self.router_spec.init_state is not None:
      self.router_state = nnx.Dict({
          name: RouterState(value)
          for name, value in self.router_spec.init_state(cfg.num_experts).items()})
    self.experts = SwiGLUExperts(cfg.num_experts, d_model, cfg.expert_d_ff, rngs=rngs)
    self.shared = nnx.data(None)
    if cfg.num_shared_experts > 0:
      self.shared = SwiGLU(d_model, cfg.num_shared_experts * cfg.shared_d_ff,
                           rngs=rngs, dtype=dtype)

  def __call__(self, x_BxLxD, *, train: bool = False, rng=None):
    cfg = self.cfg
    b, l, d = x_BxLxD.shape
    x_TxD = x_BxLxD.reshape(b * l, d)
    # Router math runs in float32 at least, whatever the compute dtype.
    router_dtype = jnp.promote_types(jnp.float32, self.dtype)
    router_in = x_TxD.astype(router_dtype)
    if train and cfg.router_jitter > 0:
      rng, jitter_rng = jax.random.split(rng)
      router_in = router_in * jax.random.uniform(
          jitter_rng, router_in.shape, router_dtype,
          1.0 - cfg.router_jitter, 1.0 + cfg.router_jitter)
    logits = router_in @ self.router_kernel[...].astype(router_dtype)
    state = ({} if self.router_state is None else
             {name: var.get_value() for name, var in self.router_state.items()})
    out = self.router_spec.route(logits, cfg=cfg, state=state, rng=rng, train=train)
    if self.router_state is not None and train:
      for name, value in out.state.items():
        self.router_state[name].set_value(jax.lax.stop_gradient(value))

    expert_fn = functools.partial(swiglu_experts, self.experts.weights(self.dtype))
    y_TxD, dispatch_metrics = self.dispatcher(x_TxD.astype(self.dtype), out.routing,
                                              expert_fn, cfg)
    if self.shared is not None:
      y_TxD = y_TxD + self.shared(x_TxD)

    loss_values = {name: losses.get_loss(name)(out)
                   for name in sorted({*DIAGNOSTIC_LOSSES, *cfg.loss_weights})}
    aux_loss = sum((cfg.loss_weights[name] * loss_values[name]
                    for name in cfg.loss_weights), jnp.zeros((), jnp.float32))
    metrics = {**out.metrics, **dispatch_metrics, **loss_values,
               **load_metrics(out.routing.expert_counts(cfg.num_experts))}
    return y_TxD.reshape(b, l, d), {"aux_loss": aux_loss, "metrics": metrics}

