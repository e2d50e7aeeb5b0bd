"""A fixed-size KV cache for the decoder (moejax/models/decoder.py).

Slots [0, max_len) per batch row. Prefill writes a left-padded prompt block
at slots [0, L); each decode step writes one token at the next slot.
`key_valid` marks slots that hold real tokens (padding and unwritten slots
are never attended), `next_position` is each row's RoPE position for its
next token (its count of real tokens so far), `length` the slots written.

Per layer, what attention keeps:
  gqa  k, v   [B, S, num_kv_heads, head_dim]   (k after RoPE)
  mla  latent [B, S, kv_lora_rank], k_rope [B, S, qk_rope_head_dim]
       (DeepSeek-V2 sec. 2.1.2: only the compressed latent and the shared
       RoPE key are cached; decoding attends over the latent in the absorbed
       form, moejax/layers/attention.py, without re-expanding it)
"""

import jax
import jax.numpy as jnp
from flax import struct

from moejax.models.decoder import DTYPES


@struct.dataclass
class KVCache:
  layers: tuple  # per layer, a dict of [B, S, ...] arrays (see module doc)
  key_valid: jax.Array  # bool [B, S]
  next_position: jax.Array  # int32 [B]
  length: jax.Array  # int32 scalar: slots written

  @property
  def max_len(self) -> int:
    return self.key_valid.shape[1]


def layer_shapes(m, batch: int, max_len: int) -> dict:
  if m.attention.kind == "mla":
    mla = m.attention.mla
    return {
      "latent": (batch, max_len, mla.kv_lora_rank),
      "k_rope": (batch, max_len, mla.qk_rope_head_dim),
    }
  kv = (batch, max_len, m.num_kv_heads, m.head_dim)
  return {"k": kv, "v": kv}


def init_cache(m, batch: int, max_len: int) -> KVCache:
  """An empty cache for `batch` rows of up to `max_len` tokens, in the compute dtype."""
  dtype = DTYPES[m.dtype]
  layers = tuple(
    {name: jnp.zeros(shape, dtype) for name, shape in layer_shapes(m, batch, max_len).items()}
    for _ in range(m.num_layers)
  )
  return KVCache(
    layers,
    jnp.zeros((batch, max_len), bool),
    jnp.zeros((batch,), jnp.int32),
    jnp.zeros((), jnp.int32),
  )


def cache_bytes(m, batch: int, max_len: int) -> int:
  """Memory the cache takes: what MLA's latent saves over GQA's keys and values."""
  itemsize = jnp.dtype(DTYPES[m.dtype]).itemsize
  per_layer = sum(int(jnp.prod(jnp.array(s))) for s in layer_shapes(m, batch, max_len).values())
  return per_layer * itemsize * m.num_layers
