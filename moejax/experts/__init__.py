"""Expert types: parameters plus a per-expert function, a grouped-matmul form
of it and optionally a fused path, registered by name (`model.moe.experts`)
so that every dispatch backend runs every expert type. The interface is
documented in base.py; add a type with one file here calling
`register_expert_type` (every module of this package is imported).

Modules here import neither moejax.dispatch nor moejax.layers (dispatch imports
experts.base, and layers.moe imports this package); the row layouts they share
with dispatch are in moejax/assignment.
"""

from moejax.experts.base import (
  EXPERT_TYPES,
  BoundExperts,
  ExpertType,
  experts_of,
  get_expert_type,
  register_expert_type,
)
from moejax.experts.swiglu import SwiGLUExperts, swiglu_experts  # registers 'swiglu'
from moejax.registry import import_package_modules

import_package_modules(__name__, __path__)  # 'atomic' (OmniMoE's atomic experts), ...

__all__ = [
  "EXPERT_TYPES",
  "BoundExperts",
  "ExpertType",
  "SwiGLUExperts",
  "experts_of",
  "get_expert_type",
  "register_expert_type",
  "swiglu_experts",
]
