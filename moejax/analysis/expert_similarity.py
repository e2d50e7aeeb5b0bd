"""Expert-similarity matrices from calibration tokens (for SERE, arXiv 2602.07616).

SERE (JL-Cheng/SERE, `calibration/`) runs every expert of a layer on the same
calibration tokens and compares their outputs. Linear CKA (Kornblith et al.
2019), the README's choice:
    X_e = expert e's outputs [N, d], centred over the N tokens,
    HSIC(a, b) = ||X_a^T X_b||_F^2,
    CKA(a, b) = HSIC(a, b) / sqrt(HSIC(a, a) HSIC(b, b))   in [0, 1].
CKA is 1 for identical (or orthogonally rotated / isotropically scaled)
outputs. The official calibration script defaults to a Frobenius similarity
(1 - d / d_max) and also offers cosine; only linear CKA is implemented here.
Every expert's outputs on the same tokens: moejax.models.capture.expert_outputs_on_tokens.
"""

import jax
import jax.numpy as jnp


def linear_cka_matrix(outputs_ExNxD: jax.Array) -> jax.Array:
  """Pairwise linear CKA of expert outputs [E, N, d] -> float32 [E, E]."""
  x = outputs_ExNxD.astype(jnp.float32)
  x = x - jnp.mean(x, axis=1, keepdims=True)

  def row(xa):  # HSIC of one expert against all: ||X_a^T X_b||_F^2 for every b
    return jax.vmap(lambda xb: jnp.sum(jnp.square(xa.T @ xb)))(x)

  hsic = jax.lax.map(row, x)
  norm = jnp.sqrt(jnp.maximum(jnp.diag(hsic), 1e-30))
  return hsic / (norm[:, None] * norm[None, :])
