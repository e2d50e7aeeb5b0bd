"""Sampling: greedy decoding equals the argmax of a full forward pass; top-k
sampling never leaves the top k."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax.config import base_config
from moejax.inference.sampling import generate, sample_logits
from moejax.train.step import split_model
from moejax.models import TransformerLM


def tiny_model():
  c = base_config().model
  c.d_model, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.d_ff = 16, 2, 2, 1, 8, 32
  c.moe.expert_d_ff = 16
  return split_model(TransformerLM(ml_collections.FrozenConfigDict(c), rngs=nnx.Rngs(3)))


def test_greedy_generation_follows_full_forward_argmax():
  graphdef, params, rest = tiny_model()
  prompt = np.array([72, 101, 108], np.int32)
  ids = generate(graphdef, params, rest, prompt, max_new_tokens=9, window=4, temperature=0.0)
  assert len(ids) == 12
  np.testing.assert_array_equal(ids[:3], prompt)
  model = nnx.merge(graphdef, params, rest)
  for n in range(3, 12):  # token n is the argmax after the last <= 4 tokens before it
    context = ids[max(0, n - 4):n]
    logits, _ = model(jnp.asarray(context)[None])
    assert ids[n] == int(jnp.argmax(logits[0, -1])), n


def test_top_k_sampling_stays_in_top_k():
  logits = jnp.array([0.0, 3.0, 1.0, 2.5, -1.0])
  draws = {int(sample_logits(logits, jax.random.key(i), 1.0, 2)) for i in range(200)}
  assert draws == {1, 3}
  assert int(sample_logits(logits, jax.random.key(0), 0.0, 0)) == 1
