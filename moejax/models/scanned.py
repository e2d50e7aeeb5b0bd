"""Scan over layers (MaxText's scan_layers; config model.scan_layers): num_layers
identical DecoderBlocks held as one block whose variables carry a leading layer axis
(logical axis None), run by jax.lax.scan: one block is traced and compiled instead of
num_layers. unstack_layers converts to the loop layout (blocks 0..L-1), which KV-cache
decoding and export read (train/load.py does it).
"""

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from moejax import sharding
from moejax.models.block import RESIDUAL_AXES, DecoderBlock
from moejax.models.structure import expert_counts, layer_windows, moe_layer_indices


def scan_layer_differences(m) -> str:
  """Why the layers of `m` cannot be scanned ('' when they are identical)."""
  moe = moe_layer_indices(m)
  if moe and len(moe) != m.num_layers:
    return f"layers {moe} are MoE and the others dense"
  if len(set(layer_windows(m))) > 1:
    return f"model.attention.windows={list(m.attention.windows)} differ"
  if len(set(expert_counts(m))) > 1:
    return f"model.moe.expert_counts={list(m.moe.expert_counts)} differ"
  if m.get("l3") is not None and m.l3.enabled:
    return f"L3 layers follow blocks {list(m.l3.layers)}"
  if moe and m.moe.get("merge") == "namex":
    return "model.moe.merge='namex' passes the base expert from layer to layer"
  return ""


class ScannedBlocks(nnx.Module):
  """num_layers identical DecoderBlocks as one block whose variables carry a
  leading layer axis (logical axis None), run by jax.lax.scan. Built as the
  loop builds them, block by block from the same rngs, then stacked: the same
  seed gives the loop model's parameters."""

  def __init__(self, m, *, rngs: nnx.Rngs, dtype):
    blocks = [DecoderBlock(m, i, rngs=rngs, dtype=dtype) for i in range(m.num_layers)]
    self.block = blocks[0]
    nnx.update(self.block, stack([nnx.state(b) for b in blocks]))
    for _, variable in nnx.iter_graph(self.block):
      if isinstance(variable, nnx.Variable):
        axes = variable.get_metadata().get("logical_axes")
        if axes is not None:
          variable.set_metadata(logical_axes=(None, *axes))
    self.num_layers = m.num_layers

  def __call__(self, x, positions, allowed, token_mask, *, train, rng, policy, step_stats=None):
    """step_stats: one per layer (Decoder), scanned over as [L, ...]."""
    graphdef, params, rest = nnx.split(self.block, nnx.Param, ...)
    stacked = stack(step_stats) if step_stats else None

    def body(x, layer):
      params_i, rest_i, index, stats_i = layer
      block = nnx.merge(graphdef, params_i, rest_i)
      x, aux, _ = block(
        x,
        positions,
        allowed,
        token_mask,
        None,
        0,
        train=train,
        rng=jax.random.fold_in(rng, index),
        step_stats=stats_i,
      )
      return sharding.constrain(x, RESIDUAL_AXES), (aux, nnx.split(block, nnx.Param, ...)[2])

    if policy is not None:
      body = jax.checkpoint(body, policy=policy)
    x, (aux, rest) = jax.lax.scan(body, x, (params, rest, jnp.arange(self.num_layers), stacked))
    nnx.update(self.block, rest)
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
