"""The one decoder: moejax's own LM and every HF family (config: moejax/config.py `model`).

Pre-norm blocks, h = x + attn(norm(x)); y = h + ffn(norm(h)), where ffn is
the MoE layer (moejax/layers/moe.py), OmniMoE's atomic-expert layer or a dense
SwiGLU (which layers: moejax.config.moe_layer_indices). With model.l3.enabled
an L3 layer (moejax/layers/lookup.py) follows each block in model.l3.layers.

    logits, aux, cache = Decoder(model_cfg)(tokens_BxL, token_mask_BxL=None,
                                            cache=None, train=False, rng=None)

Batches may be left padded: `token_mask` [B, L] marks real tokens. A
token's RoPE position counts the real tokens before it (HF generate's
position_ids), and a query sees key slots that hold real tokens, lie at or
before it and, with a sliding window w, fewer than w slots back. With a
KVCache (moejax/inference/kv_cache.py) the new tokens are written at the
cache's next slot and attend over everything cached; without one the call is
a full forward pass and returns cache=None.

aux = {"aux_loss": the weighted router losses (float32 scalar), "moe": per
MoE layer {"metrics", "expert_index", "combine_weight", "valid"}}.
Parameters are float32 (train.param_dtype may store them in bfloat16; router
parameters stay float32); activations run in `model.dtype`; logits are
float32. Under a mesh Layout the residual stream and the logits are pinned
to their logical axes (batch split; see moejax/sharding.py).
"""
import jax
import jax.numpy as jnp
from flax import nnx

from moejax import sharding
from moejax.config import layer_moe_config, moe_layer_indices
from moejax.experts.atomic import OmniMoELayer
from moejax.layers.attention import GroupedQueryAttention, LatentAttention
from moejax.layers.dense import Linear, RMSNorm, SwiGLU
from moejax.layers.lookup import build_lookup_layer
from moejax.layers.moe import MoELayer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
RESIDUAL_AXES = ("batch", "length", "act_embed")


class DecoderBlock(nnx.Module):

  def __init__(self, m, layer: int, *, rngs: nnx.Rngs, dtype):
    self.attn_norm = RMSNorm(m.d_model, m.norm_eps)
    attention = LatentAttention if m.attention.kind == "mla" else GroupedQueryAttention
    self.attn = attention(m, rngs=rngs, dtype=dtype)
    self.window = m.attention.windows[layer] if m.attention.windows else 0
    self.ffn_norm = RMSNorm(m.d_model, m.norm_eps)
    moe_layers = moe_layer_indices(m)
    self.is_moe = layer in moe_layers
    if self.is_moe and m.ffn_type == "omnimoe":
      self.ffn = OmniMoELayer(m.d_model, m.omni, rngs=rngs, dtype=dtype)
    elif self.is_moe:
      moe_cfg = layer_moe_config(m, moe_layers.index(layer))
      self.ffn = MoELayer(m.d_model, moe_cfg, rngs=rngs, dtype=dtype)
    else:
      self.ffn = SwiGLU(m.d_model, m.d_ff, rngs=rngs, dtype=dtype)

  def __call__(self, x, positions, allowed, token_mask, layer_cache, start, *, train, rng):
    if self.window:
      allowed = allowed & windowed(allowed.shape, start, self.window)
    h, layer_cache = self.attn(self.attn_norm(x), positions, allowed, layer_cache, start)
    x = x + h
    if not self.is_moe:
      return x + self.ffn(self.ffn_norm(x)), None, layer_cache
    if isinstance(self.ffn, MoELayer):
      h, aux = self.ffn(self.ffn_norm(x), token_mask=token_mask, train=train, rng=rng)
    else:
      h, aux = self.ffn(self.ffn_norm(x), train=train, rng=rng)
    return x + h, aux, layer_cache


def windowed(shape, start, window: int):
  """[1, Lq, S]: key slot within `window` slots of the query slot (Mistral)."""
  _, lq, s = shape
  query_slot = start + jnp.arange(lq)[:, None]
  return (query_slot - jnp.arange(s)[None, :] < window)[None]


class Decoder(nnx.Module):

  def __init__(self, m, *, rngs: nnx.Rngs):
    self.cfg = m
    self.dtype = DTYPES[m.dtype]
    self.embed = nnx.Param(jax.random.normal(rngs.params(), (m.vocab_size, m.d_model),
                                             jnp.float32), logical_axes=("vocab", "embed"))
    self.blocks = nnx.List([DecoderBlock(m, i, rngs=rngs, dtype=self.dtype)
                            for i in range(m.num_layers)])
    # L3 layers (moejax/layers/lookup.py), keyed by the block they follow.
    l3 = m.get("l3")
    self.lookups = nnx.Dict({str(i): build_lookup_layer(m, rngs=rngs, dtype=self.dtype)
                             for i in (l3.layers if l3 is not None and l3.enabled else ())})
    self.final_norm = RMSNorm(m.d_model, m.norm_eps)
    self.head = nnx.data(None)
    if not m.tie_embeddings:
      self.head = Linear(m.d_model, m.vocab_size, rngs=rngs, dtype=self.dtype,
                         logical_axes=("embed", "vocab"))

  def __call__(self, tokens_BxL, *, token_mask_BxL=None, cache=None, train: bool = False,
               rng=None):
    b, l = tokens_BxL.shape
    padded = token_mask_BxL is not None
    if not padded:
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
    if rng is None:
      rng = jax.random.key(0)

    # FSDP gathers the table's embed dim before the lookup (vocab stays split).
    table = sharding.constrain(self.embed[...].astype(self.dtype), ("vocab", None))
    x = sharding.constrain(table[tokens_BxL], RESIDUAL_AXES)
    aux_loss, moe_aux, new_layers = jnp.zeros((), jnp.float32), [], []
    for i, block in enumerate(self.blocks):
      layer_cache = None if cache is None else cache.layers[i]
      x, aux, layer_cache = block(x, positions, allowed, token_mask_BxL if padded else None,
                                  layer_cache, start, train=train,
                                  rng=jax.random.fold_in(rng, i))
      x = sharding.constrain(x, RESIDUAL_AXES)
      new_layers.append(layer_cache)
      if str(i) in self.lookups:  # static routing by token id: needs the ids
        x = sharding.constrain(self.lookups[str(i)](x, tokens_BxL), RESIDUAL_AXES)
      if aux is not None:
        aux_loss = aux_loss + aux["aux_loss"]
        moe_aux.append(aux)
    x = self.final_norm(x)
    if self.head is None:  # tied: the embedding table is the output projection
      logits = x.astype(self.dtype) @ self.embed[...].T.astype(self.dtype)
    else:
      logits = self.head(x)
    logits = sharding.constrain(logits.astype(jnp.float32), ("batch", "length", "act_vocab"))
    if cache is not None:
      cache = cache.replace(layers=tuple(new_layers), key_valid=key_valid, length=start + l,
                            next_position=first_position + jnp.sum(token_mask_BxL, axis=1))
    return logits, {"aux_loss": aux_loss, "moe": moe_aux}, cache
