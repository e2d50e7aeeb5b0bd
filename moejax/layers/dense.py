"""The one Linear, RMSNorm and dense SwiGLU MLP every model is built from.

Every projection names its dimensions' logical axes (moejax/sharding.py maps
them to mesh axes): column-parallel in, row-parallel out (Megatron).
Attention lives in attention.py, rotary embeddings in rope.py.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.adapters.projection import Projector, build_projection_adapters


def dense_init(scale: float = 1.0):
  return jax.nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")


class RMSNorm(nnx.Module):
  """Zhang & Sennrich 2019; statistics in float32."""

  def __init__(self, dim: int, eps: float = 1e-6):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
    self.eps = eps

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * self.scale[...]).astype(x.dtype)


class Linear(nnx.Module):
  """x @ kernel [+ bias]: float32 parameters, computed in `dtype` (HF nn.Linear).

  logical_axes names the kernel's (in, out) dimensions; the bias takes the
  out name."""

  def __init__(
    self,
    d_in: int,
    d_out: int,
    *,
    rngs: nnx.Rngs,
    dtype,
    scale=1.0,
    logical_axes=(None, None),
    bias: bool = False,
  ):
    self.kernel = nnx.Param(
      dense_init(scale)(rngs.params(), (d_in, d_out)), logical_axes=logical_axes
    )
    self.bias = (
      nnx.Param(jnp.zeros((d_out,), jnp.float32), logical_axes=logical_axes[1:])
      if bias
      else nnx.data(None)
    )
    self.dtype = dtype

  def __call__(self, x):
    y = x.astype(self.dtype) @ self.kernel[...].astype(self.dtype)
    return y if self.bias is None else y + self.bias[...].astype(self.dtype)


class SwiGLU(nnx.Module):
  """The dense FFN: down(silu(gate(x)) * up(x)); given the model section `m`, with the
  projection adapter's term on the projections it names among gate/up/down
  (moejax/adapters/projection.py)."""

  def __init__(self, d_model: int, d_ff: int, *, rngs: nnx.Rngs, dtype, m=None):
    shapes = {
      "gate": (d_model, d_ff, ("embed", "mlp")),
      "up": (d_model, d_ff, ("embed", "mlp")),
      "down": (d_ff, d_model, ("mlp", "embed")),
    }
    self.gate, self.up, self.down = (
      Linear(d_in, d_out, rngs=rngs, dtype=dtype, logical_axes=axes)
      for d_in, d_out, axes in shapes.values()
    )
    self.adapter = (
      nnx.data(None) if m is None else build_projection_adapters(m, shapes, rngs=rngs, dtype=dtype)
    )

  def __call__(self, x):
    return self.adapted(x)[0]

  def adapted(self, x, token_mask_BxL=None):
    """(out, the adapter's aux or None); token_mask_BxL: the adapter's routing skips
    padding."""
    project = Projector(self.adapter, token_mask_BxL)
    hidden = jax.nn.silu(project("gate", self.gate, x)) * project("up", self.up, x)
    return project("down", self.down, hidden), project.aux()
