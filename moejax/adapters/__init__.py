"""Adapters: prompt adapters for the ViT (moejax/models/vit.py), learned or generated
tokens in slots after the CLS token, chosen by model.vit.prompt.adapter (see base.py);
and attention projection adapters (LoRA-Mixer), a trained term added to the attention's
q/k/v/o projections, chosen by model.attention.adapter (see projection.py).

Importing this package imports every module in it, so an adapter is one file here
that calls `ADAPTERS.add` with an AdapterSpec or `PROJECTION_ADAPTERS.add` with a
ProjectionAdapterSpec.
"""

from moejax.adapters.base import (
  ADAPTERS,
  NO_ADAPTER,
  AdapterSpec,
  build_adapter,
  drop_prompts,
  place_prompts,
  validate_prompt,
)
from moejax.adapters.projection import (
  PROJECTION_ADAPTERS,
  ProjectionAdapterSpec,
  build_projection_adapters,
)
from moejax.registry import import_package_modules

import_package_modules(__name__, __path__)

__all__ = [
  "ADAPTERS",
  "NO_ADAPTER",
  "AdapterSpec",
  "PROJECTION_ADAPTERS",
  "ProjectionAdapterSpec",
  "build_projection_adapters",
  "build_adapter",
  "drop_prompts",
  "place_prompts",
  "validate_prompt",
]
