"""The OmniMoE layer (Shi et al. 2026, arXiv 2602.05711): a shared dense SwiGLU,
the Cartesian product-key router (moejax/routing/product_key.py) and N atomic
experts (moejax/experts/atomic.py, where the method, its schedules and the
guesses are described). model.ffn_type='omnimoe' puts it in the decoder.
"""
import jax.numpy as jnp
from flax import nnx

from moejax import sharding
from moejax.experts.atomic import atomic_expert_centric, atomic_init, atomic_naive
from moejax.layers.dense import SwiGLU, dense_init
from moejax.layers.moe import RouterState, load_metrics
from moejax.routing.product_key import grid_size, per_axis_k_of, route_product_key


class OmniMoELayer(nnx.Module):
  """Shared SwiGLU + product-key router + N atomic experts; returns (y, aux) like MoELayer."""

  def __init__(self, d_model: int, cfg, *, rngs: nnx.Rngs, dtype):
    self.cfg = cfg
    self.dtype = dtype
    n = grid_size(cfg.num_atomic_experts)
    self.shared = SwiGLU(d_model, cfg.shared_d_ff, rngs=rngs, dtype=dtype)
    router = lambda: nnx.Param(dense_init()(rngs.params(), (d_model, n)),
                               logical_axes=("embed", None))
    self.router_x, self.router_y = router(), router()
    self.bn_stats = nnx.Dict({
        name: RouterState(jnp.zeros((n,), jnp.float32) if name.startswith("mean")
                          else jnp.ones((n,), jnp.float32))
        for name in ("mean_x", "var_x", "mean_y", "var_y")})
    self.up = nnx.Param(atomic_init(rngs, cfg.num_atomic_experts, d_model),
                        logical_axes=(None, "embed"))
    self.down = nnx.Param(atomic_init(rngs, cfg.num_atomic_experts, d_model),
                          logical_axes=(None, "embed"))

  def route(self, x_TxD, *, train: bool):
    """(Routing, router metrics); updates the BatchNorm running statistics when training."""
    cfg = self.cfg
    x32 = x_TxD.astype(jnp.promote_types(jnp.float32, self.dtype))
    stats = {name: var.get_value() for name, var in self.bn_stats.items()}
    routing, metrics, new_stats = route_product_key(
        x32 @ self.router_x[...], x32 @ self.router_y[...], stats, top_k=cfg.top_k,
        per_axis_k=per_axis_k_of(cfg), train=train)
    if train:
      for name, var in self.bn_stats.items():
        var.set_value(new_stats[name])
    return routing, metrics

  def __call__(self, x_BxLxD, *, train: bool = False, rng=None):
    del rng
    cfg = self.cfg
    b, l, d = x_BxLxD.shape
    x_TxD = sharding.constrain(x_BxLxD.reshape(b * l, d), ("batch", "act_embed"))
    routing, metrics = self.route(x_TxD, train=train)
    x_c = x_TxD.astype(self.dtype)
    if cfg.schedule == "naive":
      y = atomic_naive(x_c, self.up[...], self.down[...], routing, cfg.activation)
    else:
      y, _ = atomic_expert_centric(x_c, self.up[...], self.down[...], routing, cfg.activation,
                                   grouped_matmul=cfg.grouped_matmul, tile=cfg.tile,
                                   block_rows=cfg.block_rows)
    y = y + self.shared(x_c)
    counts = jnp.bincount(routing.expert_index.reshape(-1), length=cfg.num_atomic_experts)
    load = load_metrics(counts, cfg.tile)
    load.pop("load_fraction")  # N entries per layer per log step: too many to log
    metrics = {**metrics, **load, "dead_fraction": jnp.mean((counts == 0).astype(jnp.float32)),
               "distinct_experts": jnp.sum(counts > 0).astype(jnp.int32)}
    return y.reshape(b, l, d), {
        "aux_loss": jnp.zeros((), jnp.float32), "metrics": metrics,
        "expert_index": routing.expert_index, "combine_weight": routing.combine_weight,
        "valid": routing.valid}
