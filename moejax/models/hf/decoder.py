"""The pre-norm decoder shared by every family (config.py names the flags).

    h = x + attn(norm(x));  y = h + ffn(norm(h))    ffn: RoutedFFN (MoE layers) or SwiGLU

Batches are left padded: `token_mask` [B, L] marks real tokens. A token's
RoPE position counts the real tokens before it (HF generate's position_ids),
and a query sees key slots that hold real tokens, lie at or before it and,
with a sliding window w, fewer than w slots back.

Call with `cache=None` for a full forward pass, or with a KVCache
(moejax/inference/kv_cache.py) to prefill or decode: the new tokens are
written at the cache's next slot and attend over everything cached.
Returns (float32 logits [B, L, V], aux, cache), aux = {"moe": per MoE layer
the RoutedFFN aux}.
"""
import jax
import jax.numpy as jnp
from flax import nnx

from moejax.layers.dense import RMSNorm, SwiGLU
from moejax.models.hf.attention import GroupedQueryAttention, LatentAttention, Projection
from moejax.models.hf.config import layer_moe_config
from moejax.models.hf.moe import RoutedFFN

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class DecoderBlock(nnx.Module):

  def __init__(self, m, layer: int, *, rngs: nnx.Rngs, dtype):
    self.attn_norm = RMSNorm(m.d_model, m.norm_eps)
    attention = LatentAttention if m.attention.kind == "mla" else GroupedQueryAttention
    self.attn = attention(m, rngs=rngs, dtype=dtype)
    self.window = m.attention.windows[layer]
    self.ffn_norm = RMSNorm(m.d_model, m.norm_eps)
    self.is_moe = layer in m.moe_layers
    if self.is_moe:
      moe_cfg = layer_moe_config(m, list(m.moe_layers).index(layer))
      self.ffn = RoutedFFN(m.d_model, moe_cfg, rngs=rngs, dtype=dtype)
    else:
      self.ffn = SwiGLU(m.d_model, m.d_ff, rngs=rngs, dtype=dtype)

  def __call__(self, x, positions, allowed, token_mask, layer_cache, start):
    if self.window:
      allowed = allowed & windowed(allowed.shape, start, self.window)
    h, layer_cache = self.attn(self.attn_norm(x), positions, allowed, layer_cache, start)
    x = x + h
    if self.is_moe:
      h, aux = self.ffn(self.ffn_norm(x), token_mask)
    else:
      h, aux = self.ffn(self.ffn_norm(x)), None
    return x + h, aux, layer_cache


def windowed(shape, start, window: int):
  """[1, Lq, S]: key slot within `window` slots of the query slot (Mistral)."""
  _, lq, s = shape
  query_slot = start + jnp.arange(lq)[:, None]
  return (query_slot - jnp.arange(s)[None, :] < window)[None]


class DecoderLM(nnx.Module):

  def __init__(self, m, *, rngs: nnx.Rngs):
    self.cfg = m
    self.dtype = DTYPES[m.dtype]
    self.embed = nnx.Param(jax.random.normal(rngs.params(), (m.vocab_size, m.d_model)))
    self.blocks = nnx.List([DecoderBlock(m, i, rngs=rngs, dtype=self.dtype)
                            for i in range(m.num_layers)])
    self.final_norm = RMSNorm(m.d_model, m.norm_eps)
    self.head = nnx.data(None)
    if not m.tie_embeddings:
      self.head = Projection(m.d_model, m.vocab_size, bias=False, rngs=rngs, dtype=self.dtype)

  def __call__(self, tokens_BxL, token_mask_BxL=None, cache=None):
    b, l = tokens_BxL.shape
    if token_mask_BxL is None:
      token_mask_BxL = jnp.ones((b, l), bool)
    token_mask_BxL = token_mask_BxL.astype(bool)
    offset = jnp.cumsum(token_mask_BxL, axis=1) - 1
    if cache is None:
      start, key_valid, first_position = 0, token_mask_BxL, jnp.zeros((b,), jnp.int32)
    else:
      start, first_position = cache.length, cache.next_position
      key_valid = jax.lax.dynamic_update_slice_in_dim(cache.key_valid, token_mask_BxL, start, 1)
    positions = first_position[:, None] + jnp.maximum(offset, 0)
    query_slot = start + jnp.arange(l)
    causal = jnp.arange(key_valid.shape[1])[None, :] <= query_slot[:, None]
    allowed = causal[None] & key_valid[:, None, :]

    x = self.embed[...].astype(self.dtype)[tokens_BxL]
    moe_aux, new_layers = [], []
    for i, block in enumerate(self.blocks):
      layer_cache = None if cache is None else cache.layers[i]
      x, aux, layer_cache = block(x, positions, allowed, token_mask_BxL, layer_cache, start)
      new_layers.append(layer_cache)
      if aux is not None:
        moe_aux.append(aux)
    x = self.final_norm(x)
    if self.head is None:  # tied: the embedding table is the output projection
      logits = x.astype(self.dtype) @ self.embed[...].T.astype(self.dtype)
    else:
      logits = self.head(x)
    logits = logits.astype(jnp.float32)
    if cache is not None:
      cache = cache.replace(layers=tuple(new_layers), key_valid=key_valid, length=start + l,
                            next_position=first_position + jnp.sum(token_mask_BxL, axis=1))
    return logits, {"moe": moe_aux}, cache
