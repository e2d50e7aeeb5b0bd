"""Autoregressive sampling without a KV cache: temperature and top-k.

Each new token re-runs the model on a fixed-size window of the last `window`
tokens (one compiled shape), reading the logits at the last real position.
The model is causal, so the unused tail of the window does not matter.
"""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.errors import ConfigError


def sample_logits(logits, rng, temperature: float, top_k: int):
  """Greedy when temperature == 0; else softmax(logits / T) over the top_k (0: all)."""
  if temperature == 0:
    return jnp.argmax(logits, axis=-1)
  if top_k > 0:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  return jax.random.categorical(rng, logits / temperature, axis=-1)


def generate(graphdef, params, rest, prompt_ids, *, max_new_tokens: int, window: int,
             temperature: float = 1.0, top_k: int = 0, seed: int = 0) -> np.ndarray:
  """Prompt ids [n] -> the n + max_new_tokens ids."""
  if temperature < 0:
    raise ConfigError(f"temperature={temperature} must be >= 0")
  if top_k < 0:
    raise ConfigError(f"top_k={top_k} must be >= 0")
  if len(prompt_ids) == 0:
    raise ConfigError("prompt is empty: give at least one token")

  @jax.jit
  def next_token(buffer, length, rng):
    logits, _ = nnx.merge(graphdef, params, rest)(buffer[None], train=False)
    return sample_logits(logits[0, length - 1], rng, temperature, top_k)

  ids = list(int(i) for i in prompt_ids)
  rng = jax.random.key(seed)
  for i in range(max_new_tokens):
    context = ids[-window:]
    buffer = np.zeros(window, np.int32)
    buffer[:len(context)] = context
    ids.append(int(next_token(buffer, len(context), jax.random.fold_in(rng, i))))
  return np.asarray(ids, np.int32)
