"""Rotary position embeddings as the HF families compute them (Su et al. 2021).

Frequencies: 'default' inv_freq_i = theta^(-2i/dim); 'yarn' (Peng et al. 2023,
YaRN, as DeepSeek-V3 and long-context Qwen use it) blends interpolated and
extrapolated frequencies over a linear ramp between the correction dims of
beta_fast and beta_slow, and scales cos/sin by an attention factor.

Layout: rotate-half pairs dim i with i + D/2 (Llama, Mixtral, Qwen, OLMoE);
`interleave` pairs 2i with 2i+1 (DeepSeek, `rope_interleave`). Either way
out = [x1 cos - x2 sin, x2 cos + x1 sin] with the pairs (x1, x2) gathered to
the two halves; q and k share the layout, so their dot products are those
of the interleaved rotation.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
  return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(rope, dim: int, inv_freq: np.ndarray) -> tuple[np.ndarray, float]:
  factor, base = rope.factor, rope.theta
  if rope.attention_factor:
    attention_factor = rope.attention_factor
  elif rope.mscale and rope.mscale_all_dim:
    attention_factor = yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim)
  else:
    attention_factor = yarn_mscale(factor)

  def correction_dim(rotations):
    return (
      dim * math.log(rope.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(base))
    )

  low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
  if rope.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  high = high + 0.001 if low == high else high
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  extrapolation = 1.0 - ramp
  blended = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
  return blended.astype(np.float32), float(attention_factor)


def rope_frequencies(rope, dim: int) -> tuple[np.ndarray, float]:
  """(inv_freq float32 [dim/2], factor multiplying cos and sin)."""
  exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
  inv_freq = (1.0 / (np.float32(rope.theta) ** exponent)).astype(np.float32)
  if rope.scaling == "yarn":
    return _yarn_inv_freq(rope, dim, inv_freq)
  return inv_freq, 1.0


def attention_scale(rope, qk_head_dim: int) -> float:
  """Softmax scale: 1/sqrt(d), times mscale(factor, mscale_all_dim)^2 under YaRN (DeepSeek)."""
  scale = qk_head_dim**-0.5
  if rope.scaling == "yarn" and rope.mscale_all_dim:
    scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
  return scale


def apply_rope(
  x_BxLxHxD: jax.Array,
  positions_BxL: jax.Array,
  inv_freq: np.ndarray,
  cos_sin_factor: float,
  interleave: bool,
) -> jax.Array:
  angle = positions_BxL[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)
  cos = (jnp.cos(angle) * cos_sin_factor)[:, :, None, :].astype(x_BxLxHxD.dtype)
  sin = (jnp.sin(angle) * cos_sin_factor)[:, :, None, :].astype(x_BxLxHxD.dtype)
  if interleave:
    x1, x2 = x_BxLxHxD[..., 0::2], x_BxLxHxD[..., 1::2]
  else:
    x1, x2 = jnp.split(x_BxLxHxD, 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
