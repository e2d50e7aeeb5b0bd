"""A decoder-only Transformer LM whose FFNs are dense SwiGLU or MoE layers.

Pre-norm blocks: x + attn(norm(x)), then x + ffn(norm(x)). Which layers are
MoE: `moe_layer_indices` (every n-th after the first m dense layers).
With model.l3.enabled an L3 layer (x + L3(x, token id), moejax/layers/lookup.py)
follows each block listed in model.l3.layers.
Parameters are float32; activations run in `model.dtype`; logits and the
loss are float32. Under a mesh Layout the residual stream and the logits are
pinned to their logical axes (batch split; see moejax/sharding.py).
"""
import jax
import jax.numpy as jnp
from flax import nnx

from moejax import sharding
from moejax.experts.atomic import OmniMoELayer
from moejax.layers.dense import Attention, Linear, RMSNorm, SwiGLU
from moejax.layers.lookup import build_lookup_layer
from moejax.layers.moe import MoELayer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def moe_layer_indices(cfg) -> list[int]:
  """Layers i >= first_dense with (i - first_dense) % every_n == 0 are MoE
  (none when model.ffn_type is 'dense'; OmniMoE layers when it is 'omnimoe')."""
  moe = cfg.moe
  if cfg.ffn_type not in ("moe", "omnimoe"):
    return []
  return [i for i in range(cfg.num_layers)
          if i >= moe.first_dense and (i - moe.first_dense) % moe.every_n == 0]


class Block(nnx.Module):

  def __init__(self, cfg, is_moe: bool, *, rngs: nnx.Rngs, dtype):
    self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
    self.attn = Attention(cfg, rngs=rngs, dtype=dtype)
    self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
    self.is_moe = is_moe
    if is_moe and cfg.ffn_type == "omnimoe":
      self.ffn = OmniMoELayer(cfg.d_model, cfg.omni, rngs=rngs, dtype=dtype)
    elif is_moe:
      self.ffn = MoELayer(cfg.d_model, cfg.moe, rngs=rngs, dtype=dtype)
    else:
      self.ffn = SwiGLU(cfg.d_model, cfg.d_ff, rngs=rngs, dtype=dtype)

  def __call__(self, x, positions, *, train, rng):
    x = x + self.attn(self.attn_norm(x), positions)
    h = self.ffn_norm(x)
    if self.is_moe:
      h, aux = self.ffn(h, train=train, rng=rng)
    else:
      h, aux = self.ffn(h), None
    return x + h, aux


class TransformerLM(nnx.Module):

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    self.cfg = cfg
    dtype = DTYPES[cfg.dtype]
    self.dtype = dtype
    self.embed = nnx.Param(jax.random.normal(
        rngs.params(), (cfg.vocab_size, cfg.d_model), jnp.float32),
        logical_axes=("vocab", "embed"))
    moe_layers = set(moe_layer_indices(cfg))
    self.blocks = nnx.List([Block(cfg, i in moe_layers, rngs=rngs, dtype=dtype)
                            for i in range(cfg.num_layers)])
    # L3 layers (moejax/layers/lookup.py), keyed by the block they follow.
    l3 = cfg.get("l3")
    self.lookups = nnx.Dict({str(i): build_lookup_layer(cfg, rngs=rngs, dtype=dtype)
                             for i in (l3.layers if l3 is not None and l3.enabled else ())})
    self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
    self.head = Linear(cfg.d_model, cfg.vocab_size, rngs=rngs, dtype=dtype,
                       logical_axes=("embed", "vocab"))

  def __call__(self, tokens_BxL, *, train: bool = False, rng=None):
    """Returns float32 logits [B, L, V] and aux = {'aux_loss', 'moe': [per-layer metrics]}."""
    b, l = tokens_BxL.shape
    positions = jnp.broadcast_to(jnp.arange(l), (b, l))
    residual_axes = ("batch", "length", "act_embed")
    # FSDP gathers the table's embed dim before the lookup (vocab stays split).
    table = sharding.constrain(self.embed[...].astype(self.dtype), ("vocab", None))
    x = sharding.constrain(table[tokens_BxL], residual_axes)
    if rng is None:
      rng = jax.random.key(0)
    aux_loss, moe_metrics = jnp.zeros((), jnp.float32), []
    for i, block in enumerate(self.blocks):
      x, aux = block(x, positions, train=train, rng=jax.random.fold_in(rng, i))
      x = sharding.constrain(x, residual_axes)
      if str(i) in self.lookups:  # static routing by token id: needs the ids
        x = sharding.constrain(self.lookups[str(i)](x, tokens_BxL), residual_axes)
      if aux is not None:
        aux_loss = aux_loss + aux["aux_loss"]
        moe_metrics.append(aux["metrics"])
    logits = self.head(self.final_norm(x)).astype(jnp.float32)
    logits = sharding.constrain(logits, ("batch", "length", "act_vocab"))
    return logits, {"aux_loss": aux_loss, "moe": moe_metrics}
