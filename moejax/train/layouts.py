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


def _map_ffns(tree, fn, new: bool):
  return jax.tree.map(
    lambda node: fn(node) if _is_omnimoe_ffn(node, new) else node,
    tree,
    is_leaf=lambda node: _is_omnimoe_ffn(node, new),
  )


class Layout:
  """One older layout: to_old(today's tree) and to_new(the old tree)."""

  def __init__(self, name: str, to_old, to_new):
    self.name, self._to_old, self._to_new = name, to_old, to_new

  def to_old(self, tree):
    return _map_ffns(tree, self._to_old, new=True)

  def to_new(self, tree):
    return _map_ffns(tree, self._to_new, new=False)


OMNIMOE_LAYER = Layout("the former OmniMoE layer", omnimoe_to_old, omnimoe_to_new)


def stored_layout(stored_config: dict) -> Layout | None:
  """The older layout a checkpoint's stored config (as saved, before
  moejax/migrate.with_defaults) says its variables have; None for today's."""
  if stored_config.get("model", {}).get("ffn_type") == "omnimoe":
    return OMNIMOE_LAYER
  return None


def placed_like(tree, target):
  """Leaves of `tree` on the shardings of `target`'s ShapeDtypeStructs (a
  migrated leaf comes back in its old layout's placement)."""

  def place(x, t):
    sharding = getattr(t, "sharding", None) if isinstance(t, jax.ShapeDtypeStruct) else None
    return x if sharding is None else jax.device_put(x, sharding)

  return jax.tree.map(place, tree, target)
