"""One pre-norm decoder block and its rematerialised call (moejax/models/decoder.py
builds the model of them; moejax/models/scanned.py stacks them for scan_layers).

  h = x + attn(attn_norm(x));  y = h + ffn(ffn_norm(h));  [y = lookup(y, token ids)]

ffn is the one MoE layer (moejax/layers/moe.py) or a dense SwiGLU (which layers:
moejax/models/structure.py moe_layer_indices). model.remat names a jax.checkpoint
policy (REMAT_POLICIES; MaxText's remat_policy): 'save_moe_routing' keeps the router
logits and the Routing (layers/moe.py ROUTING_NAMES) and recomputes the rest, expert
activations included, in the backward pass.

A block in model.l3.layers ends with an L3 layer (moejax/layers/lookup.py: static
routing by token id, its own residual). Its table rows per id (l3_rows, from
moejax/data/l3_allocation.py) are passed in, so a block reads no data, and scan
treats a block with L3 like any other: every block of a scanned model has one.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.adapters.projection import merged_aux
from moejax.layers.attention import GroupedQueryAttention, LatentAttention
from moejax.layers.dense import RMSNorm, SwiGLU
from moejax.layers.lookup import LookupLayer
from moejax.layers.moe import ROUTING_NAMES, MoELayer
from moejax.models.structure import layer_moe_config, moe_layer_indices

RESIDUAL_AXES = ("batch", "length", "act_embed")
REMAT_POLICIES = {
  "none": None,  # keep every activation
  "full": jax.checkpoint_policies.nothing_saveable,  # keep only block inputs
  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs
  "save_moe_routing": jax.checkpoint_policies.save_only_these_names(*ROUTING_NAMES),
}


def has_lookup(m, layer: int) -> bool:
  """Whether block `layer` of the model section `m` ends with an L3 layer."""
  l3 = m.get("l3")
  return l3 is not None and bool(l3.enabled) and layer in tuple(l3.layers)


class DecoderBlock(nnx.Module):
  def __init__(self, m, layer: int, *, rngs: nnx.Rngs, dtype, l3_rows=None):
    """l3_rows: rows per token id [V] of the L3 table (moejax/data/l3_allocation.py),
    needed when the block has one (has_lookup)."""
    self.attn_norm = RMSNorm(m.d_model, m.norm_eps)
    attention = LatentAttention if m.attention.kind == "mla" else GroupedQueryAttention
    self.attn = attention(m, rngs=rngs, dtype=dtype)
    self.attn_adapted = getattr(self.attn, "adapter", None) is not None
    self.window = m.attention.windows[layer] if m.attention.windows else 0
    self.ffn_norm = RMSNorm(m.d_model, m.norm_eps)
    moe_layers = moe_layer_indices(m)
    self.is_moe = layer in moe_layers
    self.ffn: MoELayer | SwiGLU
    if self.is_moe:
      index = moe_layers.index(layer)
      moe_cfg = layer_moe_config(m, index)
      self.ffn = MoELayer(m.d_model, moe_cfg, rngs=rngs, dtype=dtype, receives_base=index > 0)
    else:
      self.ffn = SwiGLU(m.d_model, m.d_ff, rngs=rngs, dtype=dtype, m=m)
    self.lookup: LookupLayer | None = nnx.data(None)
    if has_lookup(m, layer):
      if l3_rows is None:
        raise ValueError(
          f"block {layer} has an L3 layer (model.l3.layers={list(m.l3.layers)}): pass its "
          "table's rows per token id, l3_rows=moejax.data.l3_allocation.l3_rows(config) "
          "(moejax.train.build.build_model(config) does)"
        )
      self.lookup = LookupLayer(
        m.d_model, m.l3, l3_rows, rngs=rngs, dtype=dtype, norm_eps=m.norm_eps
      )

  def attend(self, *args, token_mask=None, **kwargs):
    """(h, layer_cache, the attention adapter's aux or None) of self.attn(*args, **kwargs),
    the adapter's routing skipping padding (token_mask)."""
    if not self.attn_adapted:
      return (*self.attn(*args, **kwargs), None)
    return self.attn(*args, token_mask_BxL=token_mask, with_aux=True, **kwargs)

  def __call__(
    self,
    x,
    positions,
    allowed,
    token_mask,
    layer_cache,
    start,
    *,
    train,
    rng,
    step_stats=None,
    carry=None,
    prefix=None,
    token_ids=None,
  ):
    """prefix: None or a key/value prefix hook for grouped-query attention (a ViT
    adapter's, layers/attention.py prefixed_attention); token_ids [B, L]: the tokens,
    which an L3 layer routes by."""
    if self.window:
      allowed = allowed & windowed(allowed.shape, start, self.window)
    with_prefix = {} if prefix is None else {"prefix": prefix}
    h, layer_cache, adapter_aux = self.attend(
      self.attn_norm(x),
      positions,
      allowed,
      layer_cache,
      start,
      **with_prefix,
      token_mask=token_mask,
    )
    x = x + h
    aux = None
    if self.is_moe:
      # carry: NAMEx's base expert from the previous MoE layer (merged.pass_carry)
      options = dict(
        token_mask=token_mask, train=train, rng=rng, step_stats=step_stats, carry=carry
      )
      h, aux = self.ffn(self.ffn_norm(x), **options)
    elif self.ffn.adapter is not None:  # the dense SwiGLU with LoRA experts (adapters)
      h, ffn_adapter_aux = self.ffn.adapted(self.ffn_norm(x), token_mask)
      adapter_aux = merged_aux(adapter_aux, ffn_adapter_aux)
    else:
      h = self.ffn(self.ffn_norm(x))
    x = x + h
    if self.lookup is not None:
      x = self.lookup(x, token_ids)
    return x, with_adapter(aux, adapter_aux), layer_cache


def with_adapter(aux, adapter_aux):
  """A block's aux: its MoE layer's (or None) with the attention adapter's under
  "adapter" when there is one (gather_aux separates them)."""
  return aux if adapter_aux is None else {**(aux or {}), "adapter": adapter_aux}


def rematerialised(block, policy):
  """block's call under jax.checkpoint(policy): the backward pass recomputes what
  the policy does not save. Router state the call updates is written back."""
  graphdef, params, rest = nnx.split(block, nnx.Param, ...)

  def call(x, positions, allowed, token_mask, layer_cache, start, *, train, rng, **traced):
    """traced: the block's step_stats, carry and token_ids, arguments of the
    checkpointed call."""

    def apply(params, rest, x, traced):
      inner = nnx.merge(graphdef, params, rest)
      args = (x, positions, allowed, token_mask, layer_cache, start)
      out = inner(*args, train=train, rng=rng, **traced)
      return out, nnx.split(inner, nnx.Param, ...)[2]

    out, new_rest = jax.checkpoint(apply, policy=policy)(params, rest, x, traced)
    nnx.update(block, new_rest)
    return out

  return call


def windowed(shape, start, window: int):
  """[1, Lq, S]: key slot within `window` slots of the query slot (Mistral)."""
  _, lq, s = shape
  query_slot = start + jnp.arange(lq)[:, None]
  return (query_slot - jnp.arange(s)[None, :] < window)[None]
