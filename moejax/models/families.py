"""What each released MoE family computes, as flags of the one decoder (config.py).

  family       attention  q/k norm      router (weights)                           shared expert
  mixtral      gqa        none          topk, always renormalised (Jiang et al. 2024)  none
  qwen2_moe    gqa+bias   none          topk, norm_topk_prob                     sigmoid-gated
  qwen3_moe    gqa        per_head      topk, norm_topk_prob (Qwen3 report 2025) none
  olmoe        gqa        across_heads  topk, norm_topk_prob (Muennighoff 2024)  none
  deepseek_v3  mla        (latent norms) group_limited sigmoid + bias, scaled    n plain
  moejax       gqa        none          as trained (the default Shakespeare preset) n plain

Numbers (sizes, expert counts, windows, rope) come from each checkpoint's
config.json (moejax/interop/hf_config.py).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Family:
  model_type: str  # HF config.json "model_type"
  architecture: str  # HF config.json "architectures"[0]
  attention: str = "gqa"
  qk_norm: str = "none"
  router: str = "topk"
  always_renormalize: bool = False  # Mixtral has no norm_topk_prob: it always renormalises
  shared_expert_gate: bool = False


FAMILIES = {
  f.model_type: f
  for f in (
    Family("mixtral", "MixtralForCausalLM", always_renormalize=True),
    Family("qwen2_moe", "Qwen2MoeForCausalLM", shared_expert_gate=True),
    Family("qwen3_moe", "Qwen3MoeForCausalLM", qk_norm="per_head"),
    Family("olmoe", "OlmoeForCausalLM", qk_norm="across_heads"),
    Family("deepseek_v3", "DeepseekV3ForCausalLM", attention="mla", router="group_limited"),
  )
}

# transformers 5.x defaults (each family's configuration_*.py, checked against 5.24)
# for the keys moejax/interop/hf_config.py reads, where they differ from the generic
# ones: a config.json that leaves a key out means this value
# (tests/interop/test_config_defaults.py).
FAMILY_DEFAULTS = {
  "mixtral": dict(
    num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=131072
  ),
  "qwen2_moe": dict(
    num_key_value_heads=16,
    rms_norm_eps=1e-6,
    max_position_embeddings=32768,
    moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632,
  ),
  "qwen3_moe": dict(
    num_key_value_heads=4,
    rms_norm_eps=1e-6,
    max_position_embeddings=32768,
    moe_intermediate_size=768,
  ),
  "olmoe": dict(rms_norm_eps=1e-5, max_position_embeddings=4096),
  "deepseek_v3": dict(
    num_key_value_heads=128,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    moe_intermediate_size=2048,
    first_k_dense_replace=3,
    n_group=8,
    topk_group=4,
    routed_scaling_factor=2.5,
    n_shared_experts=1,
    q_lora_rank=1536,
    rope_interleave=True,
    norm_topk_prob=True,
  ),
}
