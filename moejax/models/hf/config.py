"""The config of a pretrained-style decoder MoE (the HF families and moejax's own LM).

One schema covers Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3 and a
TransformerLM trained here: the families differ only by the flags below
(see families.py for each family's values). `model.moe` is the spine's MoE
section (moejax.config.base_config().model.moe) plus the keys that only
pretrained models use, so the router and dispatch read it as they read a
trained model's.

Flags (model.*):
  attention.kind        'gqa' (grouped-query) | 'mla' (DeepSeek-V2/V3 latent attention)
  attention.qkv_bias    biases on the input projections (Qwen2-MoE; HF attention_bias)
  attention.out_bias    bias on the output projection (HF attention_bias, not Qwen2)
  attention.qk_norm     'none' | 'per_head' (Qwen3: RMSNorm over head_dim) |
                        'across_heads' (OLMoE: RMSNorm over all heads' q and k)
  attention.clip_qkv    clamp q, k, v to [-c, c] (OLMoE; 0 = off)
  attention.windows     per-layer sliding window (Mistral/Qwen; 0 = full causal)
  attention.mla.*       q_lora_rank (0: one q projection), kv_lora_rank,
                        qk_nope_head_dim, qk_rope_head_dim, v_head_dim
  rope.*                theta, scaling ('default' | 'yarn'), yarn keys, interleave
                        (DeepSeek's pairwise layout instead of rotate-half)
  moe_layers            which layers are MoE (the rest are dense SwiGLU of width d_ff)
  moe.router            'topk' (softmax; renormalize = HF norm_topk_prob, always
                        on for Mixtral) | 'group_limited' (DeepSeek-V3) | any causal router
  moe.expert_counts     experts per MoE layer after pruning ([] = num_experts everywhere)
  moe.num_shared_experts, moe.shared_d_ff   shared SwiGLU of width n * shared_d_ff
  moe.shared_expert_gate  sigmoid(x w) scales the shared output (Qwen2-MoE)
  moe.num_groups, moe.topk_groups           group-limited routing (DeepSeek-V3)
"""
import ml_collections

from moejax import routing
from moejax.config import base_config
from moejax.errors import ConfigError, choice_error

ATTENTION_KINDS = ("gqa", "mla")
QK_NORMS = ("none", "per_head", "across_heads")
ROPE_SCALINGS = ("default", "yarn")
DTYPES = ("float32", "bfloat16")


def decoder_config() -> ml_collections.ConfigDict:
  """Every key with its default (a Llama-like MoE); families.py sets the rest."""
  m = ml_collections.ConfigDict()
  m.family = "moejax"
  m.vocab_size = 256
  m.d_model = 64
  m.num_layers = 2
  m.num_heads = 4
  m.num_kv_heads = 4
  m.head_dim = 16
  m.d_ff = 128
  m.norm_eps = 1e-6
  m.dtype = "float32"
  m.tie_embeddings = False
  m.max_position = 4096
  m.rope = ml_collections.ConfigDict(dict(
      theta=10000.0, scaling="default", interleave=False, factor=1.0,
      original_max_position=4096, beta_fast=32.0, beta_slow=1.0, mscale=0.0,
      mscale_all_dim=0.0, attention_factor=0.0, truncate=True))
  m.attention = ml_collections.ConfigDict(dict(
      kind="gqa", qkv_bias=False, out_bias=False, qk_norm="none", clip_qkv=0.0,
      windows=[0, 0]))
  m.attention.mla = ml_collections.ConfigDict(dict(
      q_lora_rank=0, kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0))
  m.moe_layers = [0, 1]
  m.moe = base_config().model.moe
  m.moe.loss_weights = {}
  m.moe.expert_counts = []
  m.moe.shared_expert_gate = False
  m.moe.num_groups = 1
  m.moe.topk_groups = 1
  m.moe.bias_update_rate = 0.0  # a loaded model's bias stays as trained
  # Small tiles: decoding sends a handful of rows per step to each expert.
  m.moe.dropless_tile = 8
  m.moe.dropless_block = 256
  return m


def layer_moe_config(m, moe_index: int) -> ml_collections.FrozenConfigDict:
  """The MoE section of one MoE layer, with its own expert count (pruned models)."""
  moe = ml_collections.ConfigDict(m.moe.to_dict())
  if m.moe.expert_counts:
    moe.num_experts = m.moe.expert_counts[moe_index]
  return ml_collections.FrozenConfigDict(moe)


def expert_counts(m) -> list[int]:
  return list(m.moe.expert_counts) or [m.moe.num_experts] * len(m.moe_layers)


def validate_decoder_config(m) -> None:
  """ConfigError naming the key for values the decoder cannot build."""
  for key in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
    if m[key] < 1:
      raise ConfigError(f"model.{key}={m[key]} must be >= 1")
  if m.dtype not in DTYPES:
    raise choice_error("model.dtype", m.dtype, DTYPES)
  if m.attention.kind not in ATTENTION_KINDS:
    raise choice_error("model.attention.kind", m.attention.kind, ATTENTION_KINDS)
  if m.attention.qk_norm not in QK_NORMS:
    raise choice_error("model.attention.qk_norm", m.attention.qk_norm, QK_NORMS)
  if m.rope.scaling not in ROPE_SCALINGS:
    raise choice_error("model.rope.scaling", m.rope.scaling, ROPE_SCALINGS)
  if m.num_heads % m.num_kv_heads:
    raise ConfigError(f"model.num_heads={m.num_heads} must be a multiple of "
                      f"model.num_kv_heads={m.num_kv_heads}")
  if len(m.attention.windows) != m.num_layers:
    raise ConfigError(f"model.attention.windows has {len(m.attention.windows)} entries "
                      f"for model.num_layers={m.num_layers}")
  if any(not 0 <= i < m.num_layers for i in m.moe_layers):
    raise ConfigError(f"model.moe_layers={list(m.moe_layers)} must be in [0, {m.num_layers})")
  if m.moe.expert_counts and len(m.moe.expert_counts) != len(m.moe_layers):
    raise ConfigError(f"model.moe.expert_counts has {len(m.moe.expert_counts)} entries for "
                      f"{len(m.moe_layers)} MoE layers")
  spec = routing.get_router(m.moe.router)
  if not spec.causal:
    raise ConfigError(f"model.moe.router={m.moe.router!r} is not causal: a decoder "
                      "routes each token from its own state only")
  for i in range(len(m.moe_layers)):
    if spec.validate is not None:
      spec.validate(layer_moe_config(m, i))
