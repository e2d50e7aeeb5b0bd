"""Does an HF export compute what moejax computes? Logits of both on one
left-padded batch (float32, real tokens only), and the top-k experts of every
MoE layer.

    diff, scale = export_logit_difference(loaded, hf_dir)   # max |ours - theirs|

transformers and torch are test requirements (requirements-test.txt), imported
here only when a comparison runs: `experiments.convert --check_logits` and
tests/interop use this one module.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.models.decoder import abstract_model

# Ten ids below 91: inside every vocabulary moejax exports (bytes are 256 + specials).
_TOKENS = [[5, 17, 33, 8, 61, 12, 90, 44, 3, 27], [0, 0, 0, 71, 9, 55, 14, 38, 80, 6]]


def padded_batch():
  """Two rows, the second left padded by 3: tokens, mask and HF position ids."""
  tokens = np.array(_TOKENS, np.int64)
  mask = (np.arange(tokens.shape[1])[None] >= np.array([[0], [3]])).astype(np.int64)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return tokens, mask, positions


def hf_forward(model, tokens, mask, positions):
  """(logits [B, L, V] float32, per MoE layer top-k indices [B*L, k]) from transformers."""
  import torch

  routed = []
  hooks = [
    module.register_forward_hook(lambda mod, args, out: routed.append(out[2].numpy()))
    for module in model.modules()
    if type(module).__name__.endswith("Router")
  ]
  try:
    with torch.no_grad():
      out = model(
        input_ids=torch.as_tensor(tokens),
        attention_mask=torch.as_tensor(mask),
        position_ids=torch.as_tensor(positions),
      )
  finally:
    for hook in hooks:
      hook.remove()
  return out.logits.float().numpy(), routed


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, params, rest, tokens, mask):
  return nnx.merge(graphdef, params, rest)(tokens, token_mask_BxL=mask)[:2]


def moejax_forward(loaded, tokens, mask):
  """(logits [B, L, V], per MoE layer expert indices) of a Loaded model (one compile
  per model structure and shapes, reused across calls)."""
  graphdef, _, _ = abstract_model(loaded.config)
  logits, aux = _forward(
    graphdef, loaded.params, loaded.rest, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool)
  )
  return np.asarray(logits), [np.asarray(layer["expert_index"]) for layer in aux["moe"]]


def require_transformers() -> None:
  """A clear error, before any work, where the comparison cannot run."""
  try:
    import torch  # noqa: F401  (imported only to test that it is installed)
    import transformers  # noqa: F401  (the same)
  except ImportError as error:
    raise ConfigError(
      f"--check_logits needs torch and transformers ({error}); install "
      "them with `bash scripts/setup.sh --test`"
    ) from None


def export_logit_difference(loaded, hf_dir: str) -> tuple[float, float]:
  """(max |moejax - transformers| over real tokens, max |transformers logit|) of
  the export in hf_dir, loaded by transformers in float32 with eager attention."""
  import transformers

  theirs = transformers.AutoModelForCausalLM.from_pretrained(
    hf_dir, attn_implementation="eager", dtype="float32"
  ).eval()
  tokens, mask, positions = padded_batch()
  hf_logits, _ = hf_forward(theirs, tokens, mask, positions)
  ours, _ = moejax_forward(loaded, tokens, mask)
  real = mask.astype(bool)
  return (float(np.abs(ours - hf_logits)[real].max()), float(np.abs(hf_logits[real]).max()))
