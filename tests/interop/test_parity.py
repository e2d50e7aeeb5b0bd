"""moejax equals transformers on every family: logits within 1e-4 (float32) on a
left-padded batch, and the same top-k experts for every real token in every
MoE layer. The models are tiny random ones that transformers made and saved."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.interop.convert import import_hf
from moejax.models.decoder import abstract_model
from tests.interop.hf_tiny import hf_forward, padded_batch


def moejax_forward(loaded, tokens, mask):
  graphdef, _, _ = abstract_model(loaded.config)
  forward = jax.jit(lambda p, r, t, m: nnx.merge(graphdef, p, r)(t, token_mask_BxL=m)[:2])
  logits, aux = forward(loaded.params, loaded.rest, jnp.asarray(tokens, jnp.int32),
                        jnp.asarray(mask, bool))
  return np.asarray(logits), [np.asarray(layer["expert_index"]) for layer in aux["moe"]]


def assert_export_matches(loaded, hf_dir: str, atol: float = 1e-4) -> None:
  """transformers loads the export in hf_dir with `loaded`'s logits on the
  padded batch (real tokens, float32)."""
  import transformers
  theirs = transformers.AutoModelForCausalLM.from_pretrained(
      hf_dir, attn_implementation="eager").eval()
  tokens, mask, positions = padded_batch()
  hf_logits, _ = hf_forward(theirs, tokens, mask, positions)
  ours, _ = moejax_forward(loaded, tokens, mask)
  valid = mask.astype(bool)
  np.testing.assert_allclose(ours[valid], hf_logits[valid], atol=atol, rtol=0)


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
  match = [bool(np.array_equal(np.sort(ours, -1)[flat_real], np.sort(theirs, -1)[flat_real]))
           for ours, theirs in zip(experts, hf_experts)]
  assert len(experts) == len(hf_experts) > 0
  return diff, match, float(np.abs(hf_logits[real]).max())


def test_logits_and_routing_equal_transformers(hf_checkpoints, family):
  # DeepSeek-V3 runs the default grouped matmul (the block loop on CPU), the rest
  # 'tiled' (the fastest to compile); tests/dispatch proves the two equal.
  grouped_matmul = "auto" if family == "deepseek_v3" else "tiled"
  diff, match, scale = parity(*hf_checkpoints(family), grouped_matmul)
  print(f"PARITY {family}: max_abs_logit_diff={diff:.2e} routing_match={match} "
        f"logit_scale={scale:.2f}")
  assert scale > 0.5  # the comparison is not between near-zero logits
  assert diff <= 1e-4
  assert all(match)
