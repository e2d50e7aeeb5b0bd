"""Tiny random HF MoE models, made and saved by transformers itself (offline).

Every family at hidden 32, 2 layers, 4-8 experts, float32; between them they
cover a sliding window (Mixtral), tied embeddings and a dense layer
(Qwen2-MoE), clipping (OLMoE), and YaRN RoPE with MLA (DeepSeek-V3). Weights are
redrawn with a fixed seed at scales that keep routing decisive (router
weights ~N(0, 1), so no two experts' scores are within float error of each
other) and exercise every parameter (norm weights != 1, biases != 0,
DeepSeek-V3's e_score_correction_bias != 0).
"""

import os


COMMON = dict(
  vocab_size=96,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=4,
  max_position_embeddings=128,
  bos_token_id=1,
  eos_token_id=2,
  pad_token_id=0,
)


def family_configs():
  import transformers as tf

  return {
    "mixtral": tf.MixtralConfig(
      **COMMON,
      num_key_value_heads=2,
      intermediate_size=24,
      num_local_experts=4,
      num_experts_per_tok=2,
      sliding_window=6,
      rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    "qwen2_moe": tf.Qwen2MoeConfig(
      **COMMON,
      num_key_value_heads=2,
      intermediate_size=48,
      moe_intermediate_size=16,
      shared_expert_intermediate_size=40,
      num_experts=6,
      num_experts_per_tok=2,
      norm_topk_prob=False,
      mlp_only_layers=[0],
      tie_word_embeddings=True,
    ),
    "qwen3_moe": tf.Qwen3MoeConfig(
      **COMMON,
      num_key_value_heads=2,
      head_dim=16,
      intermediate_size=48,
      moe_intermediate_size=16,
      num_experts=8,
      num_experts_per_tok=3,
      norm_topk_prob=True,
    ),
    "olmoe": tf.OlmoeConfig(
      **COMMON,
      num_key_value_heads=4,
      intermediate_size=16,
      num_experts=8,
      num_experts_per_tok=2,
      clip_qkv=1.5,
    ),
    "deepseek_v3": tf.DeepseekV3Config(
      **COMMON,
      num_key_value_heads=4,
      intermediate_size=48,
      moe_intermediate_size=16,
      n_routed_experts=8,
      n_shared_experts=1,
      num_experts_per_tok=3,
      n_group=4,
      topk_group=2,
      first_k_dense_replace=1,
      routed_scaling_factor=2.5,
      kv_lora_rank=16,
      q_lora_rank=24,
      qk_rope_head_dim=8,
      qk_nope_head_dim=8,
      v_head_dim=12,
      rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
      },
    ),
  }


FAMILY_NAMES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3")


def randomize_(model, seed: int) -> None:
  """Redraw every parameter and buffer of a torch model in place (see module doc)."""
  import torch

  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
      if "inv_freq" in name:
        continue
      noise = torch.randn(tensor.shape, generator=gen)
      if name.endswith("norm.weight") or "layernorm" in name:
        tensor.copy_(1.0 + 0.2 * noise)
      elif name.endswith("gate.weight") and tensor.shape[0] > 1:  # routers
        tensor.copy_(noise)
      elif "e_score_correction_bias" in name or name.endswith(".bias"):
        tensor.copy_(0.1 * noise)
      else:
        tensor.copy_(noise * tensor.shape[-1] ** -0.5)


def make_model(family: str, seed: int = 0, vocab_size: int | None = None, **overrides):
  """A tiny random `family` model (vocab_size: e.g. 256 to train on byte tokens;
  overrides: other config.json keys)."""
  import torch
  import transformers

  torch.manual_seed(seed)
  config = family_configs()[family]
  if vocab_size is not None:
    config.vocab_size = vocab_size
  for key, value in overrides.items():
    setattr(config, key, value)
  model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
  randomize_(model, seed)
  return model.eval()


def save_model(model, directory: str) -> str:
  """save_pretrained with small shards, so the index file and several shards are read."""
  model.save_pretrained(directory, max_shard_size="40KB")
  assert os.path.exists(os.path.join(directory, "model.safetensors.index.json"))
  return directory
