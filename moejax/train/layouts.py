"""Variable layouts of older moejax checkpoints, read into today's model.

moejax.migrate.migrate_legacy upgrades a stored config; when the model's
variables moved as well, the layout change is written here as a pair of maps
on one FFN's dict (old -> new, new -> old), and Checkpointer.restore
(moejax/train/checkpoint.py) reads such a checkpoint by restoring into the
old layout of today's abstract state and mapping the result forward. The maps
apply to every dict of the train state that holds the layer's variables:
parameters, their optimizer moments and the non-trained state alike.

OmniMoE, before it became the one MoE layer (stored config model.ffn_type ==
'omnimoe'), per FFN:
    router_x, router_y [d, n]   -> router_projection {w_x, w_y}
    up, down [N, d]             -> experts {u [N, d, 1], d [N, 1, d]}
    bn_stats {mean_x, ...}      -> router_state {mean_x, ...}
    shared (SwiGLU)             -> shared (the same SwiGLU: one shared expert)

L3 before it moved into the block (a stored tree with a top-level `lookups`):
    lookups {"i": {keys, values, ..., offsets, lengths}} -> blocks {i: {lookup: ...}}
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec


def _reshaped(x, shape, keep_axes):
  """x reshaped (an array, or a ShapeDtypeStruct whose sharding keeps the spec
  entries of `keep_axes`, the axes that survive the reshape)."""
  if not isinstance(x, jax.ShapeDtypeStruct):
    return x.reshape(shape)
  sharding = x.sharding
  if isinstance(sharding, NamedSharding):
    spec = tuple(sharding.spec) + (None,) * (len(x.shape) - len(sharding.spec))
    old_spec = [None] * len(shape)
    for new_axis, old_axis in keep_axes.items():
      old_spec[new_axis] = spec[old_axis]
    sharding = NamedSharding(sharding.mesh, PartitionSpec(*old_spec))
  return jax.ShapeDtypeStruct(shape, x.dtype, sharding=sharding)


def _is_omnimoe_ffn(node, new: bool) -> bool:
  if not isinstance(node, dict):
    return False
  if new:
    return "router_projection" in node or "mean_x" in (node.get("router_state") or {})
  return "router_x" in node or "bn_stats" in node


def omnimoe_to_old(ffn: dict) -> dict:
  """Today's OmniMoE FFN dict in the layout of the former OmniMoE layer."""
  out = {k: v for k, v in ffn.items() if k not in ("router_projection", "experts", "router_state")}
  if "router_projection" in ffn:
    out["router_x"], out["router_y"] = (ffn["router_projection"][k] for k in ("w_x", "w_y"))
  if "experts" in ffn:
    u, d = ffn["experts"]["u"], ffn["experts"]["d"]
    out["up"] = _reshaped(u, (u.shape[0], u.shape[1]), {0: 0, 1: 1})
    out["down"] = _reshaped(d, (d.shape[0], d.shape[2]), {0: 0, 1: 2})
  if "router_state" in ffn:
    out["bn_stats"] = ffn["router_state"]
  return out


def omnimoe_to_new(ffn: dict) -> dict:
  """The former OmniMoE layer's FFN dict in today's layout (omnimoe_to_old inverted)."""
  out = {
    k: v for k, v in ffn.items() if k not in ("router_x", "router_y", "up", "down", "bn_stats")
  }
  if "router_x" in ffn:
    out["router_projection"] = {"w_x": ffn["router_x"], "w_y": ffn["router_y"]}
  if "up" in ffn:
    up, down = ffn["up"], ffn["down"]
    out["experts"] = {
      "u": _reshaped(up, (*up.shape, 1), {0: 0, 1: 1}),
      "d": _reshaped(down, (down.shape[0], 1, down.shape[1]), {0: 0, 2: 1}),
    }
  if "bn_stats" in ffn:
    out["router_state"] = ffn["bn_stats"]
  return out


def _is_model_with_lookups(node, new: bool) -> bool:
  """A model's dict (params, state or an optimizer moment) holding L3 tables: in
  today's layout under blocks {i: {lookup}}, in the old one under `lookups`."""
  if not isinstance(node, dict):
    return False
  if not new:
    return "lookups" in node
  blocks = node.get("blocks")
  return isinstance(blocks, dict) and any(
    isinstance(block, dict) and "lookup" in block for block in blocks.values()
  )


def lookups_to_old(model: dict) -> dict:
  """Today's model dict with its blocks' L3 tables under a top-level `lookups`
  {"i": table}; blocks left empty are dropped, as the old tree had none."""
  blocks, lookups = {}, {}
  for i, block in model["blocks"].items():
    if isinstance(block, dict) and "lookup" in block:
      lookups[str(i)] = block["lookup"]
      block = {k: v for k, v in block.items() if k != "lookup"}
    if block:
      blocks[i] = block
  out = {k: v for k, v in model.items() if k != "blocks"}
  return {**out, **({"blocks": blocks} if blocks else {}), "lookups": lookups}


def lookups_to_new(model: dict) -> dict:
  """The old model dict (`lookups` {"i": table}) with each table in block i."""
  blocks = dict(model.get("blocks", {}))
  for i, table in model["lookups"].items():
    key = next((k for k in blocks if str(k) == str(i)), int(i))
    blocks[key] = {**blocks.get(key, {}), "lookup": table}
  out = {k: v for k, v in model.items() if k != "lookups"}
  return {**out, "blocks": blocks}


class Layout:
  """One older layout: to_old(today's tree) and to_new(the old tree), each mapping
  every node `is_node(node, new)` says holds the variables that moved."""

  def __init__(self, name: str, to_old, to_new, is_node):
    self.name, self._to_old, self._to_new, self._is_node = name, to_old, to_new, is_node

  def _map(self, tree, fn, new: bool):
    return jax.tree.map(
      lambda node: fn(node) if self._is_node(node, new) else node,
      tree,
      is_leaf=lambda node: self._is_node(node, new),
    )

  def to_old(self, tree):
    return self._map(tree, self._to_old, new=True)

  def to_new(self, tree):
    return self._map(tree, self._to_new, new=False)


OMNIMOE_LAYER = Layout("the former OmniMoE layer", omnimoe_to_old, omnimoe_to_new, _is_omnimoe_ffn)
L3_AFTER_BLOCKS = Layout(
  "L3 layers after the blocks", lookups_to_old, lookups_to_new, _is_model_with_lookups
)


def _holds_key(tree, key: str) -> bool:
  """Whether a dict anywhere in `tree` (nested dicts, lists, tuples) has `key`."""
  if isinstance(tree, dict):
    return key in tree or any(_holds_key(v, key) for v in tree.values())
  if isinstance(tree, (list, tuple)):
    return any(_holds_key(v, key) for v in tree)
  return False


def stored_layout(stored_config: dict, stored_tree=None) -> Layout | None:
  """The older layout a checkpoint has, from its stored config (as saved, before
  moejax/migrate.with_defaults) and its stored tree (orbax metadata); None for
  today's."""
  if stored_config.get("model", {}).get("ffn_type") == "omnimoe":
    return OMNIMOE_LAYER
  if stored_tree is not None and _holds_key(stored_tree, "lookups"):
    return L3_AFTER_BLOCKS
  return None


def placed_like(tree, target):
  """Leaves of `tree` on the shardings of `target`'s ShapeDtypeStructs (a
  migrated leaf comes back in its old layout's placement)."""

  def place(x, t):
    sharding = getattr(t, "sharding", None) if isinstance(t, jax.ShapeDtypeStruct) else None
    return x if sharding is None else jax.device_put(x, sharding)

  return jax.tree.map(place, tree, target)
