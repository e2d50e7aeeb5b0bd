"""Decoder MoE families with HF-compatible weights (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V3).

One decoder (decoder.py) built from the spine's routers, SwiGLU experts and
dispatch; the families differ by config flags (config.py, families.py).
"""
from moejax.models.hf.config import decoder_config, validate_decoder_config
from moejax.models.hf.decoder import DecoderLM
from moejax.models.hf.families import FAMILIES
