"""Pallas kernels for moejax. See kernels/README.md.

Grouped matmul (dropless MoE experts): ``gmm`` / ``tgmm`` with a custom_vjp,
TPU (Mosaic) and GPU (Triton) Pallas kernels, and pure-jnp references.
"""

from .gmm_reference import gmm_reference, tgmm_reference
from .grouped_matmul import BACKENDS, DEFAULT_TILING, gmm, tgmm

__all__ = ["BACKENDS", "DEFAULT_TILING", "gmm", "gmm_reference", "tgmm", "tgmm_reference"]
