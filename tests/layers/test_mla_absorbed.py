"""MLA's absorbed decode (moejax/layers/attention.py, LatentAttention._absorbed)
equals the re-expanding form, with and without a cache, and is what decoding
with a cache runs."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.interop.hf_config import from_hf_config
from moejax.layers.attention import LatentAttention
from tests.interop.hf_tiny import family_configs


def setup():
  m = from_hf_config(family_configs()["deepseek_v3"].to_dict())
  attn = LatentAttention(m, rngs=nnx.Rngs(0), dtype=jnp.float32)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 7, m.d_model)), jnp.float32)
  positions = jnp.broadcast_to(jnp.arange(7), (2, 7))
  mask = np.ones((2, 7), bool)
  mask[1, :3] = False  # a left-padded row
  allowed = jnp.tril(jnp.ones((7, 7), bool))[None] & jnp.asarray(mask)[:, None, :]
  return m, attn, x, positions, allowed


def test_absorbed_equals_expanded_without_a_cache():
  _, attn, x, positions, allowed = setup()
  expanded, _ = attn(x, positions, allowed, absorb=False)
  absorbed, _ = attn(x, positions, allowed, absorb=True)
  scale = float(jnp.abs(expanded).max())
  np.testing.assert_allclose(np.asarray(absorbed), np.asarray(expanded), atol=1e-5 * scale, rtol=0)


def test_decoding_with_a_cache_absorbs_by_default_and_equals_the_expanded_form():
  m, attn, x, positions, allowed = setup()
  cache = {
    "latent": jnp.zeros((2, 9, m.attention.mla.kv_lora_rank)),
    "k_rope": jnp.zeros((2, 9, m.attention.mla.qk_rope_head_dim)),
  }
  allowed9 = jnp.pad(allowed, ((0, 0), (0, 0), (0, 2)))
  default, _ = attn(x, positions, allowed9, cache, 0)
  expanded, _ = attn(x, positions, allowed9, cache, 0, absorb=False)
  absorbed, _ = attn(x, positions, allowed9, cache, 0, absorb=True)
  np.testing.assert_array_equal(np.asarray(default), np.asarray(absorbed))
  scale = float(jnp.abs(expanded).max())
  np.testing.assert_allclose(np.asarray(absorbed), np.asarray(expanded), atol=1e-5 * scale, rtol=0)
  assert not np.allclose(np.asarray(absorbed), 0.0)
