"""VAPT ("Adaptive Prompt: Unlocking the Power of Visual Prompt Tuning", ICLR, arXiv
2501.18936; the generator of its method section): prompt experts that depend on the input.

VPT's prompts are constants; VAPT generates block i's N prompts from that block's
input patch tokens X_i in R^{P x d} (P = g * g patches on a g x g grid):

    Z = LayerNorm_i(X_i)                       per block, over d
    Z = reshape(Z) to the grid [g, g, d]
    Z = K_i * Z                                one k x k kernel K_i shared by all d
                                               channels (depthwise, no bias; valid
                                               convolution after `padding` zeros)
    G = W_i^T flatten(Z) + b_i                 token-wise projection R^{g'g'} -> R^N,
                                               W_i, b_i zero-initialised
    P_i = G + MLP(G)                           MLP(G) = relu(G A) B, A: d x h, B: h x d,
                                               no biases, shared by all blocks

so P_i = 0 for every input at initialisation (G = 0, MLP(0) = 0) and becomes
input-dependent once W_i moves. Parameters: per block 2d + k^2 + g'g' N + N, plus
2 d h shared, against VPT-deep's L N d.

What is a guess or a difference from the official code: prompts are generated at
every block here, the first included (from the embedded patches); the official code
gives the first block a learned VPT prompt (VPT_DEPTH = 1). Its dropout after the
convolution (Dropout2d) and on the prompts is left out; the kernel is drawn N(0, 1)
as there; LayerNorm eps 1e-5 (torch's default); the MLP's activation is ReLU.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.adapters.base import ADAPTERS, AdapterSpec
from moejax.errors import ConfigError

LAYER_NORM_EPS = 1e-5
SETTINGS = (("kernel", 2), ("padding", 0), ("mlp_hidden", 8))


def grid_side(m) -> int:
  return m.vit.image_size // m.vit.patch_size


def conv_side(m, s) -> int:
  """g': the side of the convolved grid."""
  return grid_side(m) + 2 * s["padding"] - s["kernel"] + 1


def depthwise_conv(grid_BxGxGxD, kernel_KxK, padding: int):
  """One k x k kernel applied to every channel (cross-correlation, as torch's conv2d):
  out[b, r, c, d] = sum_{u,v} K[u, v] in[b, r + u, c + v, d] over the zero-padded grid."""
  b, g, _, d = grid_BxGxGxD.shape
  per_channel = grid_BxGxGxD.transpose(0, 3, 1, 2).reshape(b * d, g, g, 1)
  out = jax.lax.conv_general_dilated(
    per_channel,
    kernel_KxK[:, :, None, None].astype(per_channel.dtype),
    (1, 1),
    [(padding, padding)] * 2,
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
  )
  side = out.shape[1]
  return out.reshape(b, d, side, side).transpose(0, 2, 3, 1)


def layer_norm(x, scale, bias):
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + LAYER_NORM_EPS) * scale + bias


class AdaptivePrompts(nnx.Module):
  """The generators of all blocks (stacked over the block axis) and the shared MLP."""

  def __init__(self, m, s: dict, *, rngs: nnx.Rngs):
    layers, d, h = m.num_layers, m.d_model, s["mlp_hidden"]
    self.num_tokens = n = m.vit.prompt.num_tokens
    self.padding = s["padding"]
    cells = conv_side(m, s) ** 2
    self.norm_scale = nnx.Param(jnp.ones((layers, d), jnp.float32))
    self.norm_bias = nnx.Param(jnp.zeros((layers, d), jnp.float32))
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (layers, s["kernel"], s["kernel"])))
    self.token_proj = nnx.Param(jnp.zeros((layers, cells, n), jnp.float32))
    self.token_bias = nnx.Param(jnp.zeros((layers, n), jnp.float32))
    self.mlp_in = nnx.Param(jax.random.normal(rngs.params(), (d, h)) / d**0.5)
    self.mlp_out = nnx.Param(jax.random.normal(rngs.params(), (h, d)) / h**0.5)

  def generated(self, layer: int, patches_BxPxD):
    """G [B, N, d]: the token-wise projection of the convolved, normalised grid."""
    b, p, d = patches_BxPxD.shape
    side = round(p**0.5)
    z = layer_norm(patches_BxPxD.astype(jnp.float32), self.norm_scale[layer], self.norm_bias[layer])
    z = depthwise_conv(z.reshape(b, side, side, d), self.kernel[layer], self.padding)
    z = z.reshape(b, -1, d)
    return jnp.einsum("bcd,cn->bnd", z, self.token_proj[layer]) + self.token_bias[layer][:, None]

  def __call__(self, layer: int, patches_BxPxD):
    """P_i = G + MLP(G), [B, N, d] float32."""
    g = self.generated(layer, patches_BxPxD)
    return g + jax.nn.relu(g @ self.mlp_in[...]) @ self.mlp_out[...]


def validate(s: dict, m) -> None:
  for key, low in (("kernel", 1), ("padding", 0), ("mlp_hidden", 1)):
    if isinstance(s[key], bool) or not isinstance(s[key], int) or s[key] < low:
      raise ConfigError(f"model.vit.prompt.vapt.{key}={s[key]!r} must be an int >= {low}")
  if conv_side(m, s) < 1:
    raise ConfigError(
      f"model.vit.prompt.vapt.kernel={s['kernel']} is larger than the "
      f"{grid_side(m)}x{grid_side(m)} patch grid padded by {s['padding']}"
    )


ADAPTERS.add(
  "vapt",
  AdapterSpec(
    build=lambda m, settings, rngs: AdaptivePrompts(m, settings, rngs=rngs),
    settings=SETTINGS,
    validate=validate,
    per_block=True,
  ),
)
