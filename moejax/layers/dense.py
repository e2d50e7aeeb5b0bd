"""RMSNorm, rotary embeddings, grouped-query causal attention and the dense SwiGLU MLP.

Every projection names its dimensions' logical axes (moejax/sharding.py maps
them to mesh axes): column-parallel in, row-parallel out (Megatron).
"""
import jax
import jax.numpy as jnp
from flax import nnx


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


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """RoPE (Su et al. 2021) on x [B, L, H, D], rotate-half layout (Llama / HF)."""
  half = x.shape[-1] // 2
  freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions[..., None].astype(jnp.float32) * freq  # [B, L, half]
  cos, sin = jnp.cos(angle)[:, :, None, :], jnp.sin(angle)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class Linear(nnx.Module):
  """A bias-free projection with float32 parameters, computed in `dtype`."""

  def __init__(self, d_in: int, d_out: int, *, rngs: nnx.Rngs, dtype, scale=1.0,
               logical_axes=(None, None)):
    self.kernel = nnx.Param(dense_init(scale)(rngs.params(), (d_in, d_out)),
                            logical_axes=logical_axes)
    self.dtype = dtype

  def __call__(self, x):
    return x.astype(self.dtype) @ self.kernel[...].astype(self.dtype)


class Attention(nnx.Module):
  """Causal self-attention with grouped-query heads (Ainslie et al. 2023) and RoPE."""

  def __init__(self, cfg, *, rngs: nnx.Rngs, dtype):
    d, h = cfg.d_model, cfg.head_dim
    self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, h
    self.rope_theta = cfg.rope_theta
    self.q = Linear(d, cfg.num_heads * h, rngs=rngs, dtype=dtype,
                    logical_axes=("embed", "heads"))
    self.k = Linear(d, cfg.num_kv_heads * h, rngs=rngs, dtype=dtype,
                    logical_axes=("embed", "kv_heads"))
    self.v = Linear(d, cfg.num_kv_heads * h, rngs=rngs, dtype=dtype,
                    logical_axes=("embed", "kv_heads"))
    self.o = Linear(cfg.num_heads * h, d, rngs=rngs, dtype=dtype,
                    logical_axes=("heads", "embed"))

  def __call__(self, x_BxLxD, positions_BxL):
    b, l, _ = x_BxLxD.shape
    q = self.q(x_BxLxD).reshape(b, l, self.num_heads, self.head_dim)
    k = self.k(x_BxLxD).reshape(b, l, self.num_kv_heads, self.head_dim)
    v = self.v(x_BxLxD).reshape(b, l, self.num_kv_heads, self.head_dim)
    q = rotary(q, positions_BxL, self.rope_theta)
    k = rotary(k, positions_BxL, self.rope_theta)
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return self.o(out.reshape(b, l, self.num_heads * self.head_dim))


class SwiGLU(nnx.Module):
  """The dense FFN: down(silu(gate(x)) * up(x))."""

  def __init__(self, d_model: int, d_ff: int, *, rngs: nnx.Rngs, dtype):
    self.gate = Linear(d_model, d_ff, rngs=rngs, dtype=dtype, logical_axes=("embed", "mlp"))
    self.up = Linear(d_model, d_ff, rngs=rngs, dtype=dtype, logical_axes=("embed", "mlp"))
    self.down = Linear(d_ff, d_model, rngs=rngs, dtype=dtype, logical_axes=("mlp", "embed"))

  def __call__(self, x):
    return self.down(jax.nn.silu(self.gate(x)) * self.up(x))
