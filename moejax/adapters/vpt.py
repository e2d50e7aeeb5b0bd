"""VPT (Jia et al. 2022, "Visual Prompt Tuning", sec. 3.2): learned prompt tokens.

  vpt_shallow  N tokens P in R^{N x d} inserted at the first block's input only
               (eq. 5); later blocks see the previous block's outputs in the slots.
  vpt_deep     N tokens P_i per block, replacing the slots at every block's input
               (eq. 6-7): L * N * d parameters.

The tokens are the same for every input (VPT's prompt experts W_V^T p are constants,
the point VAPT makes). Initialised Xavier-uniform over (P * P * C, d), as VPT's
code does for its patch embedding's fan-in.
"""

import jax.numpy as jnp
from flax import nnx

from moejax.adapters.base import ADAPTERS, AdapterSpec, xavier_uniform


class StaticPrompts(nnx.Module):
  """Learned tokens for the first `num_blocks` blocks (1: shallow, all: deep)."""

  def __init__(self, m, num_blocks: int, *, rngs: nnx.Rngs):
    v = m.vit
    self.num_tokens = v.prompt.num_tokens
    self.tokens = nnx.Param(
      xavier_uniform(
        rngs.params(),
        (num_blocks, self.num_tokens, m.d_model),
        v.patch_size**2 * v.num_channels,
        m.d_model,
      ),
      logical_axes=(None, None, "embed"),
    )

  def __call__(self, layer: int, patches_BxPxD):
    """[B, N, d]: block `layer`'s tokens, the same for every image; None past the last."""
    if layer >= self.tokens.shape[0]:
      return None
    tokens = self.tokens[layer]
    return jnp.broadcast_to(tokens, (patches_BxPxD.shape[0], *tokens.shape))


ADAPTERS.add(
  "vpt_shallow", AdapterSpec(build=lambda m, settings, rngs: StaticPrompts(m, 1, rngs=rngs))
)
ADAPTERS.add(
  "vpt_deep",
  AdapterSpec(
    build=lambda m, settings, rngs: StaticPrompts(m, m.num_layers, rngs=rngs), per_block=True
  ),
)
