"""Models, built by name from the config (`model_name`, big_vision style).

  decoder   the one decoder LM: moejax's own MoE LM and the HF families
            (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V3); moejax/models/decoder.py
  vit       an image classifier (ViT, V-MoE) of the decoder's blocks, non-causal;
            moejax/models/vit.py

`build_model(model_name, model_cfg, rngs)` is what the trainer calls, so a
new model slots in with one registration.
"""

from collections.abc import Callable

from flax import nnx

from moejax.models.decoder import DTYPES, Decoder
from moejax.models.families import FAMILIES
from moejax.models.vit import VisionTransformer
from moejax.registry import Registry

__all__ = ["DTYPES", "FAMILIES", "MODELS", "Decoder", "VisionTransformer", "build_model"]

MODELS: Registry[Callable[..., nnx.Module]] = Registry("model_name")
MODELS.add("decoder", Decoder)
MODELS.add("vit", VisionTransformer)


def build_model(model_name: str, model_cfg, *, rngs, **inputs):
  """The registered model `model_name` built from the `model` config section (and
  what the config alone cannot give, e.g. `l3_rows` counted on the run's data)."""
  return MODELS.get(model_name)(model_cfg, rngs=rngs, **inputs)
