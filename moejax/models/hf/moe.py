"""The routed FFN of the pretrained families, built from the spine's parts.

    logits = x W_r (float32)  -> registered router (topk | group_limited | ...) -> Routing
    y = dispatch(x, Routing, swiglu_experts) [+ shared(x) [* sigmoid(x w_g)]]

The router, SwiGLU experts and dispatch backend are the ones a moejax-trained
MoE uses (moejax.routing, moejax.experts, moejax.dispatch); only the shared
expert gate is new here: Qwen2-MoE (Qwen1.5-MoE) scales its shared expert by
a per-token sigmoid gate. Padding tokens get invalid slots, so they cost no
expert compute and do not count in the load.

Returns (y, aux) with aux = {"expert_index", "combine_weight", "valid"
(the Routing, [T, S]), "metrics"} so analysis tools and parity tests see
every layer's decisions.
"""
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from moejax import dispatch, routing
from moejax.experts import SwiGLUExperts, swiglu_experts
from moejax.layers.dense import SwiGLU
from moejax.layers.moe import router_inputs, router_variables


class RoutedFFN(nnx.Module):

  def __init__(self, d_model: int, cfg, *, rngs: nnx.Rngs, dtype):
    """cfg: the layer's MoE section (config.layer_moe_config)."""
    self.cfg, self.dtype = cfg, dtype
    self.router_spec = routing.get_router(cfg.router)
    self.dispatcher = dispatch.get_dispatcher(cfg.dispatch)
    self.router_kernel = nnx.Param(jax.nn.initializers.variance_scaling(
        cfg.router_init_scale, "fan_in", "truncated_normal")(
            rngs.params(), (d_model, cfg.num_experts), jnp.float32))
    self.router_params, self.router_state = router_variables(self.router_spec,
                                                             cfg.num_experts)
    self.experts = SwiGLUExperts(cfg.num_experts, d_model, cfg.expert_d_ff, rngs=rngs)
    self.shared = nnx.data(None)
    self.shared_gate = nnx.data(None)
    if cfg.num_shared_experts > 0:
      self.shared = SwiGLU(d_model, cfg.num_shared_experts * cfg.shared_d_ff,
                           rngs=rngs, dtype=dtype)
      if cfg.shared_expert_gate:
        self.shared_gate = nnx.Param(jnp.zeros((d_model, 1), jnp.float32))

  def __call__(self, x_BxLxD, token_mask_BxL):
    cfg = self.cfg
    b, l, d = x_BxLxD.shape
    x_TxD = x_BxLxD.reshape(b * l, d)
    logits = x_TxD.astype(jnp.float32) @ self.router_kernel[...]
    out = self.router_spec.route(logits, cfg=cfg, rng=None, train=False,
                                 state=router_inputs(self.router_params, self.router_state))
    token_valid = token_mask_BxL.reshape(b * l, 1)
    assignment = out.routing.with_valid(out.routing.valid & token_valid)
    weights = self.experts.weights(self.dtype)
    y_TxD, dispatch_metrics = self.dispatcher(
        x_TxD.astype(self.dtype), assignment, functools.partial(swiglu_experts, weights), cfg)
    if self.shared is not None:
      shared = self.shared(x_TxD)
      if self.shared_gate is not None:
        gate = x_TxD.astype(jnp.float32) @ self.shared_gate[...]
        shared = shared * jax.nn.sigmoid(gate).astype(shared.dtype)
      y_TxD = y_TxD + shared
    counts = assignment.expert_counts(cfg.num_experts)
    metrics = {**out.metrics, **dispatch_metrics,
               "distinct_experts": jnp.sum(counts > 0).astype(jnp.int32),
               "expert_counts": counts}
    aux = {"expert_index": assignment.expert_index, "combine_weight": assignment.combine_weight,
           "valid": assignment.valid, "metrics": metrics}
    return y_TxD.reshape(b, l, d), aux
