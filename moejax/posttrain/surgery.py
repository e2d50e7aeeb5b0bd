"""Model surgery: remove experts from MoE layers.

`remove_experts` keeps, per MoE block, a chosen set of experts and returns a
model config whose `moe.expert_counts` holds the new counts, with parameters
and router state cut to match. Which axes are expert axes is read, not
assumed: the new config's abstract model (models.decoder.abstract_model) is
compared leaf by leaf with the old one, and an axis whose size changed from
E to m is indexed by the kept experts (router kernel columns, every expert
weight, per-expert router biases, an E x E router state on both axes). Every
other leaf is carried over unchanged. The pruned model is an ordinary
config + parameters: it trains, generates, shards and exports like any other.

After surgery the router picks its top-k among the kept experts only (their
logits are unchanged; the dropped ones are gone), so tokens whose choice
included a dropped expert now go to their next kept one.

Optional `scales`: the least-squares weights a_e of SCHUR-A*'s rescaled
objective (posttrain/expert_subset.rescale_weights), folded into each kept
expert's output projection (SwiGLU's w_down), so expert e's output is a_e E_e(x).
"""

from __future__ import annotations

import ml_collections
import numpy as np

from moejax.models.structure import expert_counts, moe_layer_indices
from moejax.errors import ConfigError
from moejax.merging.experts import merge_in_layer
from moejax.models.decoder import abstract_model


def pruned_config(m, keep: dict):
  """A copy of the model config `m` whose MoE blocks hold len(keep[block]) experts
  (blocks not in `keep` keep all theirs). Checks every kept set (module doc)."""
  blocks = moe_layer_indices(m)
  if not blocks:
    raise ConfigError("the checkpoint has no MoE layer: nothing to prune")
  unknown = sorted(set(keep) - set(blocks))
  if unknown:
    raise ConfigError(f"keep names blocks {unknown}, which are not MoE blocks {blocks}")
  counts = []
  for block, count in zip(blocks, expert_counts(m)):
    kept = [int(e) for e in keep.get(block, range(count))]
    if len(set(kept)) != len(kept) or not all(0 <= e < count for e in kept):
      raise ConfigError(f"keep[{block}]={kept} must be distinct experts in [0, {count})")
    if len(kept) < m.moe.top_k:
      raise ConfigError(
        f"keep[{block}] has {len(kept)} experts, below model.moe.top_k={m.moe.top_k}"
      )
    counts.append(len(kept))
  new = ml_collections.ConfigDict(m.to_dict())
  if len(set(counts)) == 1:
    new.moe.num_experts, new.moe.expert_counts = counts[0], []
  else:
    new.moe.expert_counts = counts
  return new


def _cut(old, new_shape, kept):
  old = np.asarray(old)
  for axis, (before, after) in enumerate(zip(old.shape, new_shape)):
    if before != after:
      if after != len(kept):
        raise AssertionError(f"axis {axis}: {before} -> {after}, not the {len(kept)} kept")
      old = np.take(old, kept, axis=axis)
  return old


def _cut_tree(old: dict, new_abstract: dict, kept_of_block: dict, path=()):
  if isinstance(old, dict):
    return {k: _cut_tree(old[k], new_abstract[k], kept_of_block, path + (k,)) for k in old}
  if tuple(np.shape(old)) == tuple(new_abstract.shape):
    return old
  if len(path) < 2 or path[0] != "blocks" or int(path[1]) not in kept_of_block:
    raise ConfigError(
      f"parameter {'/'.join(map(str, path))} changes shape outside a "
      "pruned MoE block (a scanned model? unstack its layers first)"
    )
  return _cut(old, new_abstract.shape, kept_of_block[int(path[1])])


def remove_experts(m, params: dict, rest: dict, keep: dict, scales: dict | None = None):
  """(new model config, params, rest) keeping experts keep[block] (sorted) of each
  MoE block of the model config `m` (loop layout); params and rest are pure dicts.
  scales[block]: the output weight of each kept expert, in sorted order (module doc)."""
  new = pruned_config(m, keep)
  kept_of_block = {
    b: sorted(int(e) for e in keep.get(b, range(n)))
    for b, n in zip(moe_layer_indices(m), expert_counts(m))
  }
  _, new_params, new_rest = abstract_model(new)
  params = _cut_tree(params, new_params, kept_of_block)
  rest = _cut_tree(rest, new_rest, kept_of_block)
  for block, weights in (scales or {}).items():
    experts = params["blocks"][block]["ffn"]["experts"]
    if "w_down" not in experts:
      raise ConfigError(f"scales: block {block}'s experts have no w_down to fold a_e into")
    weights = np.asarray(weights, np.float32)
    if weights.shape != (len(kept_of_block[block]),):
      raise ConfigError(
        f"scales[{block}] has {weights.shape[0]} weights for "
        f"{len(kept_of_block[block])} kept experts"
      )
    w_down = np.asarray(experts["w_down"])
    experts["w_down"] = (w_down * weights[:, None, None]).astype(w_down.dtype)
  return new, params, rest


# Step's merge (posttrain/prune.py) lives in the merging module: the kept expert's
# weights become the routing-mass-weighted average over it and the experts merged into it.
merge_experts = merge_in_layer
