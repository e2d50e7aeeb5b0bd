"""The one decoder: moejax's own LM and every HF family (config: moejax/config.py `model`).

Pre-norm blocks (moejax/models/block.py), h = x + attn(norm(x)); y = h + ffn(norm(h)),
where ffn is the one MoE layer (moejax/layers/moe.py; OmniMoE is its product_key
router with atomic experts) or a dense SwiGLU (which layers: moejax/models/structure.py
moe_layer_indices). With model.l3.enabled each block in model.l3.layers ends with
an L3 layer (moejax/layers/lookup.py), its rows per token id passed in (l3_rows).

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
MoE layer {"metrics", "step_stats", "expert_index", "combine_weight", "valid"}},
and with an attention adapter (model.attention.adapter, moejax/adapters/) "adapters":
per block its aux (gather_aux).
`step_stats`, one {loss name: stats} per MoE layer (gradient accumulation,
moejax/train/step.py), replaces each layer's own loss statistics.

Scale skeleton (MaxText's scan_layers and remat_policy):
  model.scan_layers  the blocks' variables are stacked on a leading layer axis
                     (moejax/models/scanned.py): nnx.vmap builds them and nnx.scan
                     runs them, so one block is traced and compiled instead of
                     num_layers. Only for identical layers
                     (scan_layer_differences); the loop stays for the rest
                     (pruned layers with unequal expert counts, L3 after
                     some blocks only, windows that differ). A seed gives
                     other parameters than the loop model's; stack_layers and
                     unstack_layers convert between the layouts. KV-cache
                     decoding and export read the loop layout (load.py
                     unstacks).
  model.remat        a jax.checkpoint policy per block, by name (REMAT_POLICIES):
                     'save_moe_routing' keeps the router logits and the Routing
                     (layers/moe.py ROUTING_NAMES) and recomputes the rest,
                     expert activations included, in the backward pass.
Parameters are float32 (train.param_dtype may store them in bfloat16; router
parameters stay float32); activations run in `model.dtype`; logits are
float32. Under a mesh Layout the residual stream and the logits are pinned
to their logical axes (batch split; see moejax/sharding.py).
"""

from collections.abc import Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax import sharding
from moejax.experts import merged
from moejax.layers.dense import Linear, RMSNorm
from moejax.layers.lookup import allocate_rows
from moejax.models.block import REMAT_POLICIES, RESIDUAL_AXES, DecoderBlock, rematerialised
from moejax.models.scanned import ScannedBlocks
from moejax.models.scanned import scan_layer_differences as scan_layer_differences
from moejax.models.scanned import stack_layers as stack_layers
from moejax.models.scanned import unstack_layers as unstack_layers

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class DecodeCache(Protocol):
  """The KV cache a decoding call reads and returns (moejax/inference/kv_cache.KVCache,
  which this layer cannot import)."""

  layers: tuple
  key_valid: jax.Array  # bool [B, S]
  next_position: jax.Array  # int32 [B]
  length: jax.Array  # int32 scalar

  def replace(self, **changes: Any) -> "DecodeCache": ...


def is_moe_block(blocks) -> list[bool]:
  """Per block, whether it is an MoE block (a scanned stack: the one block's flag)."""
  if isinstance(blocks, ScannedBlocks):
    return [blocks.block.is_moe] * blocks.num_layers
  return [block.is_moe for block in blocks]


def gather_aux(layers_aux, is_moe) -> dict:
  """The model's aux from its blocks' (None or with_adapter's): {"aux_loss": the MoE
  layers' and adapters' weighted losses, "moe": per MoE block its layer aux, and
  "adapters": per adapted block {"aux_loss", "projections": {name: {"aux_loss",
  "metrics", "expert_index", "valid"}}} when the attention has an adapter}."""
  moe = [
    {key: value for key, value in aux.items() if key != "adapter"}
    for aux, sparse in zip(layers_aux, is_moe)
    if sparse
  ]
  adapters = [aux["adapter"] for aux in layers_aux if aux is not None and "adapter" in aux]
  aux_loss = sum((aux["aux_loss"] for aux in moe + adapters), jnp.zeros((), jnp.float32))
  out = {"aux_loss": aux_loss, "moe": moe}
  if adapters:
    out["adapters"] = adapters
  return out


class Decoder(nnx.Module):
  def __init__(self, m, *, rngs: nnx.Rngs, l3_rows=None):
    """l3_rows: rows per token id [V] of the L3 tables when model.l3 is on
    (moejax.data.l3_allocation.l3_rows(config)); else None."""
    self.cfg = m
    self.dtype = DTYPES[m.dtype]
    self.embed = nnx.Param(
      jax.random.normal(rngs.params(), (m.vocab_size, m.d_model), jnp.float32),
      logical_axes=("vocab", "embed"),
    )
    self.blocks: ScannedBlocks | nnx.List[DecoderBlock]
    if m.scan_layers:
      self.blocks = ScannedBlocks(m, rngs=rngs, dtype=self.dtype, l3_rows=l3_rows)
    else:
      self.blocks = nnx.List(
        [
          DecoderBlock(m, i, rngs=rngs, dtype=self.dtype, l3_rows=l3_rows)
          for i in range(m.num_layers)
        ]
      )
    self.final_norm = RMSNorm(m.d_model, m.norm_eps)
    self.head = nnx.data(None)
    if not m.tie_embeddings:
      self.head = Linear(
        m.d_model, m.vocab_size, rngs=rngs, dtype=self.dtype, logical_axes=("embed", "vocab")
      )

  def output_projection(self, h):
    """Logits of final hidden states h [..., d] (after final_norm): the head, or the
    embedding table when tied. Linear, so it maps h_a - h_b to logits_a - logits_b."""
    if self.head is None:  # tied: the embedding table is the output projection
      return h.astype(self.dtype) @ self.embed[...].T.astype(self.dtype)
    return self.head(h)

  def block_list(self) -> nnx.List[DecoderBlock]:
    """The blocks of the loop layout; ValueError for a scanned model (unstack_layers)."""
    if isinstance(self.blocks, ScannedBlocks):
      raise ValueError("a scanned model has no per-block modules: unstack_layers")
    return self.blocks

  def __call__(
    self,
    tokens_BxL: jax.Array,
    *,
    token_mask_BxL: jax.Array | None = None,
    cache: DecodeCache | None = None,
    train: bool = False,
    rng: jax.Array | None = None,
    step_stats: Sequence[dict] | None = None,
    last_logits_only: bool = False,
    with_hidden: bool = False,
  ) -> tuple[jax.Array, dict[str, Any], DecodeCache | None]:
    """(float32 logits [B, L, V] (L = 1 with last_logits_only), {'aux_loss': float32
    scalar, 'moe': per MoE layer its aux dict}, the cache with the new tokens written
    or None) of tokens [B, L]. token_mask_BxL: bool [B, L], False at padding;
    step_stats: per MoE layer its router's step statistics (losses.base); with_hidden:
    aux also holds 'final_hidden', the final norm's output [B, L, d] (the head's input)."""
    b, length = tokens_BxL.shape
    padded = token_mask_BxL is not None
    token_mask_BxL = (
      jnp.ones((b, length), bool) if token_mask_BxL is None else token_mask_BxL.astype(bool)
    )
    offset = jnp.cumsum(token_mask_BxL, axis=1) - 1
    start: int | jax.Array
    if cache is None:
      start, key_valid, first_position = 0, token_mask_BxL, jnp.zeros((b,), jnp.int32)
    else:
      start, first_position = cache.length, cache.next_position
      key_valid = jax.lax.dynamic_update_slice_in_dim(cache.key_valid, token_mask_BxL, start, 1)
    positions = first_position[:, None] + jnp.maximum(offset, 0)
    query_slot = start + jnp.arange(length)
    causal = jnp.arange(key_valid.shape[1])[None, :] <= query_slot[:, None]
    allowed = causal[None] & key_valid[:, None, :]
    if rng is None:
      rng = jax.random.key(0)

    # FSDP gathers the table's embed dim before the lookup (vocab stays split).
    table = sharding.constrain(self.embed[...].astype(self.dtype), ("vocab", None))
    x = sharding.constrain(table[tokens_BxL], RESIDUAL_AXES)
    policy = REMAT_POLICIES[self.cfg.remat]
    mask = token_mask_BxL if padded else None
    new_layers = []
    if isinstance(self.blocks, ScannedBlocks):
      if cache is not None:
        raise ValueError("a scanned model decodes in the loop layout: unstack_layers")
      x, layers_aux = self.blocks(
        x,
        positions,
        allowed,
        mask,
        train=train,
        rng=rng,
        policy=policy,
        step_stats=step_stats,
        token_ids=tokens_BxL,
      )
    else:
      layers_aux = []
      moe_blocks = [i for i, block in enumerate(self.blocks) if block.is_moe]
      block_stats = dict(zip(moe_blocks, step_stats or ()))
      carry = None  # NAMEx: base expert and momentum, from MoE layer to MoE layer
      for i, block in enumerate(self.blocks):
        layer_cache = None if cache is None else cache.layers[i]
        call = block if policy is None else rematerialised(block, policy)
        x, aux, layer_cache = call(
          x,
          positions,
          allowed,
          mask,
          layer_cache,
          start,
          train=train,
          rng=jax.random.fold_in(rng, i),
          step_stats=block_stats.get(i),
          carry=carry,
          token_ids=tokens_BxL,
        )
        aux, carry = merged.pass_carry(aux, carry)
        x = sharding.constrain(x, RESIDUAL_AXES)
        new_layers.append(layer_cache)
        layers_aux.append(aux)
    model_aux = gather_aux(layers_aux, is_moe_block(self.blocks))
    if last_logits_only:  # decoding reads only the last position's logits
      x = x[:, -1:]
    hidden = self.final_norm(x)
    if with_hidden:
      model_aux["final_hidden"] = hidden
    logits = self.output_projection(hidden)
    logits = sharding.constrain(logits.astype(jnp.float32), ("batch", "length", "act_vocab"))
    if cache is not None:
      cache = cache.replace(
        layers=tuple(new_layers),
        key_valid=key_valid,
        length=start + length,
        next_position=first_position + jnp.sum(token_mask_BxL, axis=1),
      )
    return logits, model_aux, cache


def skeleton_decoder(m, *, rngs: nnx.Rngs) -> Decoder:
  """Decoder(m) for a caller that replaces its variables (a restore, a copy from
  another model): an L3 layer's shapes do not depend on its allocation, so uniform
  rows stand in for the data's (the table comes with the variables)."""
  l3 = m.get("l3")
  rows = None
  if l3 is not None and l3.enabled:
    rows = allocate_rows(np.ones(m.vocab_size), l3.budget, l3.cap)
  return Decoder(ml_collections.FrozenConfigDict(m), rngs=rngs, l3_rows=rows)


def abstract_model(m):
  """(graphdef, params, rest) of Decoder(m) as ShapeDtypeStructs: nothing allocated."""
  model = nnx.eval_shape(lambda: skeleton_decoder(m, rngs=nnx.Rngs(0)))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return graphdef, nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
