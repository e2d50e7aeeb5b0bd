"""moejax equals transformers on every family: logits within 1e-4 (float32) on a
left-padded batch, and the same top-k experts for every real token in every
MoE layer. The models are tiny random ones that transformers made and saved."""

import numpy as np

from moejax.interop.convert import import_hf
from moejax.interop.parity import hf_forward, moejax_forward, padded_batch


def parity(hf_model, hf_dir, grouped_matmul="tiled"):
  """(max abs logit diff over real tokens, per-layer routing match, logit scale)."""
  tokens, mask, positions = padded_batch()
  hf_logits, hf_experts = hf_forward(hf_model, tokens, mask, positions)
  loaded = import_hf(hf_dir)
  loaded.config.moe.grouped_matmul = grouped_matmul  # 'tiled' compiles fastest on CPU
  logits, experts = moejax_forward(loaded, tokens, mask)
  real = mask.astype(bool)
  diff = float(np.abs(logits - hf_logits)[real].max())
  flat_real = real.reshape(-1)
  match = [
    bool(np.array_equal(np.sort(ours, -1)[flat_real], np.sort(theirs, -1)[flat_real]))
    for ours, theirs in zip(experts, hf_experts)
  ]
  assert len(experts) == len(hf_experts) > 0
  return diff, match, float(np.abs(hf_logits[real]).max())


def test_logits_and_routing_equal_transformers(hf_checkpoints, family):
  # DeepSeek-V3 runs the default grouped matmul (the block loop on CPU), the rest
  # 'tiled' (the fastest to compile); tests/dispatch proves the two equal.
  grouped_matmul = "auto" if family == "deepseek_v3" else "tiled"
  diff, match, scale = parity(*hf_checkpoints(family), grouped_matmul)
  print(
    f"PARITY {family}: max_abs_logit_diff={diff:.2e} routing_match={match} logit_scale={scale:.2f}"
  )
  assert scale > 0.5  # the comparison is not between near-zero logits
  assert diff <= 1e-4
  assert all(match)
