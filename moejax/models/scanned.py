"""Scan over layers (MaxText's scan_layers; config model.scan_layers): num_layers
identical DecoderBlocks held as one block whose variables carry a leading layer axis.

The stack is built by nnx.vmap over rngs split per layer (nnx.split_rngs, the Flax
"scan over layers" pattern): the block's construction is traced once, not num_layers
times. It runs under nnx.scan: the block's call is traced and compiled once. LAYER_AXIS,
the transforms' metadata, puts the layer axis (logical axis None) in front of every
variable's `logical_axes`, which sharding.logical_axes_of reads, and takes it off
inside the scanned call.

Layer i's parameters come from the i-th split key, not from the stream the loop draws
block by block, so one seed gives the scanned and the loop model different parameters.
stack_layers and unstack_layers convert between the loop layout (blocks 0..L-1) and the
scanned one (blocks.block, leaves [L, ...]): given the loop model's parameters stacked,
the scanned model computes what the loop computes (tests/models/test_scale_skeleton.py).
KV-cache decoding and export read the loop layout (train/load.py unstacks).
"""

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from moejax import sharding
from moejax.models.block import RESIDUAL_AXES, DecoderBlock, has_lookup, rematerialised
from moejax.models.structure import expert_counts, layer_windows, moe_layer_indices

# nnx.vmap / nnx.scan transform_metadata: the layer axis is logical axis None.
LAYER_AXIS = {nnx.PARTITION_NAME: None, "logical_axes": None}


def scan_layer_differences(m) -> str:
  """Why the layers of `m` cannot be scanned ('' when they are identical)."""
  moe = moe_layer_indices(m)
  if moe and len(moe) != m.num_layers:
    return f"layers {moe} are MoE and the others dense"
  if len(set(layer_windows(m))) > 1:
    return f"model.attention.windows={list(m.attention.windows)} differ"
  if len(set(expert_counts(m))) > 1:
    return f"model.moe.expert_counts={list(m.moe.expert_counts)} differ"
  l3 = [i for i in range(m.num_layers) if has_lookup(m, i)]
  if l3 and len(l3) != m.num_layers:
    return f"blocks {l3} end with an L3 layer and the others do not"
  if moe and m.moe.get("merge") == "namex":
    return "model.moe.merge='namex' passes the base expert from layer to layer"
  return ""


class ScannedBlocks(nnx.Module):
  """num_layers identical DecoderBlocks as one block whose variables (parameters,
  router state, lookup tables alike) carry a leading layer axis. Built by nnx.vmap
  over rngs split per layer: layer i draws from the i-th key (not the loop's
  parameters; stack_layers gives a scanned model those)."""

  def __init__(self, m, *, rngs: nnx.Rngs, dtype, l3_rows=None):
    @nnx.split_rngs(splits=m.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata=LAYER_AXIS)
    def build(rngs):
      # every layer is layer 0's (scan_layer_differences refuses layers that differ)
      return DecoderBlock(m, 0, rngs=rngs, dtype=dtype, l3_rows=l3_rows)

    self.block = build(rngs)
    self.num_layers = m.num_layers

  def __call__(
    self,
    x,
    positions,
    allowed,
    token_mask,
    *,
    train,
    rng,
    policy,
    step_stats=None,
    token_ids=None,
  ):
    """(x after the last layer, per layer its aux as the loop's list) under nnx.scan, the
    block rematerialised as the loop's (rematerialised(block, policy)) when policy is not
    None. step_stats: one per layer (Decoder), scanned over as [L, ...]. Layer i draws
    from fold_in(rng, i), as in the loop, and its router state is written back to row i.
    token_ids: the tokens, which L3 layers route by (every layer's the same)."""
    stacked = stack(step_stats) if step_stats else None

    @nnx.scan(in_axes=(0, nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0), transform_metadata=LAYER_AXIS)
    def layer(block, x, index, stats):
      call = block if policy is None else rematerialised(block, policy)
      args = (x, positions, allowed, token_mask, None, 0)
      key = jax.random.fold_in(rng, index)
      x, aux, _ = call(*args, train=train, rng=key, step_stats=stats, token_ids=token_ids)
      return sharding.constrain(x, RESIDUAL_AXES), aux

    x, aux = layer(self.block, x, jnp.arange(self.num_layers), stacked)
    if aux is None:
      return x, []
    return x, unstack(aux, self.num_layers)


def stack(trees):
  """The trees (of one structure) as one, each leaf stacked on a new leading axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree, n: int) -> list:
  """The n trees of a tree whose leaves are stacked on a leading axis of n (stack's inverse)."""
  return [jax.tree.map(lambda a, i=i: a[i], tree) for i in range(n)]


def with_scan_layers(m, scan: bool) -> ml_collections.ConfigDict:
  """A copy of the model section `m` with model.scan_layers=scan."""
  m = ml_collections.ConfigDict(m.to_dict())
  m.scan_layers = scan
  return m


def unstack_layers(m, params: dict, rest: dict):
  """(m, params, rest) of a scanned model in the loop layout (blocks 0..L-1), which
  the KV cache, export and the loop read; unchanged for a loop model."""
  if not m.get("scan_layers", False):
    return m, params, rest

  def unstack_blocks(tree):
    if "blocks" not in tree:
      return tree
    return {**tree, "blocks": dict(enumerate(unstack(tree["blocks"]["block"], m.num_layers)))}

  return with_scan_layers(m, False), unstack_blocks(params), unstack_blocks(rest)


def stack_layers(m, params: dict, rest: dict):
  """(m, params, rest) of a loop model in the scanned layout (blocks.block, leaves
  [L, ...]), which a model.scan_layers=True model merges: the inverse of
  unstack_layers; unchanged for a scanned model. ValueError when the layers differ
  (scan_layer_differences)."""
  if m.get("scan_layers", False):
    return m, params, rest
  if why := scan_layer_differences(m):
    raise ValueError(f"the layers cannot be stacked: {why}")

  def stack_blocks(tree):
    if "blocks" not in tree:
      return tree
    return {**tree, "blocks": {"block": stack([tree["blocks"][i] for i in range(m.num_layers)])}}

  return with_scan_layers(m, True), stack_blocks(params), stack_blocks(rest)
