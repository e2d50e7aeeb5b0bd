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
