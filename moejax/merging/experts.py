"""Merging experts inside one MoE layer: the expert stack's slices as trees.

`merge_in_layer` gives each kept expert k of a layer the merge of k and the
experts merged into it (Step's merge, moejax/posttrain/prune.py: the pruned
experts into their most similar kept expert, weighted by routing mass; the rule
is our guess, the paper's abstract names no formula). Each expert's slice of
every stacked weight [E, ...] is one tree; the registered method (`average` by
default; `task_arithmetic` or `ties` take the kept expert as their base) merges
the group's trees. The weights are the members' routing mass over its sum (kept
expert first), not checked against the simplex: a group with no mass gets weight
0 everywhere, as before.
"""

from __future__ import annotations

import numpy as np

from moejax.merging.base import bind


def groups_of(merges: dict) -> dict[int, list[int]]:
  """{kept expert: [kept, merged experts in the order given]} from {merged: kept}."""
  groups: dict[int, list[int]] = {}
  for merged, kept in merges.items():
    groups.setdefault(int(kept), [int(kept)]).append(int(merged))
  return groups


def merge_stack(
  stack: dict, merges: dict, mass, method: str = "average", settings: dict | None = None
) -> dict:
  """A copy of the expert stack {name: [E, ...]} where each kept expert holds its
  group's merge (module doc); other experts are unchanged."""
  merge = bind(method, settings)
  mass = np.asarray(mass, np.float64)
  out = {name: np.array(w) for name, w in stack.items()}
  for kept, members in groups_of(merges).items():
    weights = mass[members] / max(mass[members].sum(), 1e-30)
    trees = [{name: np.asarray(w)[m] for name, w in stack.items()} for m in members]
    base = trees[0] if merge.method.needs_base else None
    merged = merge.method.fn(base, trees, weights, merge.settings)
    for name in out:
      out[name][kept] = merged[name]
  return out


def merge_in_layer(
  params: dict,
  block: int,
  merges: dict,
  mass,
  method: str = "average",
  settings: dict | None = None,
) -> dict:
  """A copy of `params` where, in MoE block `block`, each kept expert k's weights
  become the merge of k and the experts merged into it (merges: {merged expert:
  kept expert}, mass: routing mass per expert); only the expert weights change."""
  ffn = params["blocks"][block]["ffn"]
  experts = merge_stack(dict(ffn["experts"]), merges, mass, method, settings)
  out = {**params, "blocks": dict(params["blocks"])}
  out["blocks"][block] = {**params["blocks"][block], "ffn": {**ffn, "experts": experts}}
  return out
