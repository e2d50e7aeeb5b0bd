"""Expert pruning of a model (loop layout, pure-dict params): calibration
statistics -> the pruner's selection per MoE layer (or an atom pruner's global
ranking; methods.PRUNERS) -> surgery.remove_experts (or atoms.remove_atoms).

`prune_model` prunes a model config and its parameters on a shared
`calibration.Calibration`; `Pruning` is the request (method, keep level,
objective), checked by moejax.posttrain.request.check_request. Reading a source
and writing the pruned workdir: moejax.posttrain.prune_workdir.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.errors import ConfigError
from moejax.merging.experts import merge_in_layer
from moejax.posttrain import atoms, contributions, expert_subset, methods, surgery
from moejax.posttrain.calibration import Calibration
from moejax.posttrain.parts import lookup


KNEE = "knee"  # --keep=knee: each layer's budget at the knee of err(m) (expert_subset.knee)
# How a pruned expert is merged into a kept one (moejax/merging/experts.py): not at all,
# or the routing-mass-weighted mean of the raw parameters (Step's merge, our guess).
# "" = the method's own (its registered `merge`): average for `step`, none for the others.
MERGES = ("none", "average")
# The kept partner a pruned expert merges into: the most similar by `output` (every
# expert run on the same calibration tokens, contributions.LayerStatistics.outputs),
# or by `contribution` (the routed-contribution Gram G: co-activation, not function).
PARTNERS = ("output", "contribution")


@dataclasses.dataclass(frozen=True)
class Pruning:
  """A pruning request: `method` (methods.PRUNERS) keeps `keep` per MoE layer."""

  method: str
  keep: str
  objective: str = "rescaled"
  rescale: bool = False
  seed: int = 0
  merge: str = ""  # MERGES, "" = the method's own (merge_rule)
  partner: str = "output"  # PARTNERS
  normalisation: str = "routed"  # methods.NORMALISATIONS (HEAPr's per-expert scaling)


def merge_rule(method: str, merge: str = "") -> str:
  """The merge `method` runs with: `merge`, or "" for the method's own (MERGES)."""
  return merge or methods.pruner(method).merge


def check_options(r: Pruning, keys: dict | None = None) -> None:
  """ConfigError for a merge, partner or normalisation that is not known, or a
  merge the request cannot take (an atom method, keep=knee, rescale), naming `keys`."""
  keys = {
    "merge": "--merge",
    "partner": "--partner",
    "normalisation": "--normalisation",
    "rescale": "--rescale",
    "keep": "--keep",
    "method": "--method",
    **(keys or {}),
  }
  from moejax.errors import choice_error

  pruner = methods.pruner(r.method, keys["method"])
  if r.merge and r.merge not in MERGES:
    raise choice_error(keys["merge"], r.merge, MERGES)
  if r.partner not in PARTNERS:
    raise choice_error(keys["partner"], r.partner, PARTNERS)
  if r.normalisation not in methods.NORMALISATIONS:
    raise choice_error(keys["normalisation"], r.normalisation, methods.NORMALISATIONS)
  if (r.merge or pruner.merge) == "none":
    return
  if pruner.kind == "atom":
    raise ConfigError(
      f"{keys['merge']}={r.merge}: {keys['method']}={r.method} removes atoms, not experts to merge"
    )
  if r.keep == KNEE:
    raise ConfigError(
      f"{keys['keep']}=knee reads err(m) of the Gram objective, which a "
      f"merge ({keys['merge']}={merge_rule(r.method, r.merge)}) changes"
    )
  if r.rescale:
    raise ConfigError(
      f"{keys['rescale']}: the least-squares weights are those of the "
      f"unmerged experts ({keys['merge']}={merge_rule(r.method, r.merge)})"
    )


def kept_count(keep: str, num_experts: int, top_k: int, key: str = "--keep") -> int:
  """keep as a count: a fraction of E in (0, 1] ('0.5') or a count ('8'); errors
  name `key`."""
  try:
    value = float(keep) if "." in keep else int(keep)
  except (TypeError, ValueError):
    raise ConfigError(
      f"{key}={keep}: expected a fraction of the experts in (0, 1] (0.5), a count (8) or {KNEE!r}"
    ) from None
  count = round(value * num_experts) if isinstance(value, float) else value
  if isinstance(value, float) and not 0 < value <= 1:
    raise ConfigError(f"{key}={keep}: a fraction must be in (0, 1]")
  if count > num_experts:
    raise ConfigError(f"{key}={keep} is larger than the layer's {num_experts} experts")
  if count < top_k:
    raise ConfigError(f"{key}={keep} keeps {count} experts, below the router's top_k={top_k}")
  return count


def atom_fraction(keep: str, key: str = "--keep") -> float:
  """keep for an atom method: the fraction of all expert atoms kept, in (0, 1]."""
  try:
    value = float(keep)
  except (TypeError, ValueError):
    value = None
  if value is None or "." not in keep or not 0 < value <= 1:
    raise ConfigError(
      f"{key}={keep}: an atom method keeps a fraction of all atoms, in (0, 1] (0.75)"
    )
  return value


def choose_experts(stats, keep: str, top_k: int, method: str, objective: str, seed: int):
  """{block: kept experts} and {block: err(S) / err(empty)} for every MoE layer, by
  the expert pruner `method` (methods.PRUNERS) with `objective` and `seed` where it
  has them. keep=knee: per layer, the method's subsets for m = top_k..E, and the m
  at the knee of their err(m) (SCHUR-A*'s layer budgets; with schur_astar, err(m)
  is the optimal curve)."""
  select = lookup(methods.PRUNERS, method, kind="expert").bind_from(
    {"objective": objective, "seed": seed}
  )
  kept, errors = {}, {}
  for layer in stats:
    total = max(expert_subset.subset_error(layer.gram, (), objective), 1e-300)

    def relative(subset, layer=layer, total=total):
      return expert_subset.subset_error(layer.gram, subset, objective) / total

    def pick(m, layer=layer):
      return select(layer, m)

    if keep == KNEE:
      subsets = [pick(m) for m in range(top_k, len(layer.gram) + 1)]
      curve = [relative(subset) for subset in subsets]
      kept[layer.block] = subsets[expert_subset.knee(curve) - 1]
    else:
      kept[layer.block] = pick(kept_count(keep, len(layer.gram), top_k))
    errors[layer.block] = relative(kept[layer.block])
  return kept, errors


def most_similar_kept(gram: np.ndarray, kept) -> dict:
  """{pruned expert: the kept expert of largest cosine G_ij / sqrt(G_ii G_jj)}; with
  the output Gram O (PARTNERS) the cosine of two experts' outputs on the same tokens."""
  gram = np.asarray(gram, np.float64)
  norm = np.sqrt(np.maximum(np.diag(gram), 1e-300))
  cosine = gram / norm[:, None] / norm[None, :]
  kept = list(kept)
  return {p: kept[int(np.argmax(cosine[p, kept]))] for p in range(len(gram)) if p not in kept}


def prune_atoms(
  m,
  params: dict,
  rest: dict,
  calibration: Calibration,
  *,
  keep: str,
  method: str,
  seed: int = 0,
  normalisation: str = "routed",
):
  """HEAPr-style global atom pruning (posttrain/atoms.py): keep the `keep` fraction
  of all atoms by the atom pruner `method`'s scores (methods.PRUNERS; `seed` and
  `normalisation`, methods.NORMALISATIONS, where it has them)."""
  fraction = atom_fraction(keep)
  score = methods.PRUNERS.get(method).bind_from({"seed": seed, "normalisation": normalisation})
  scores = score(calibration.atom_sums, params=params)
  kept = atoms.global_keep(scores, fraction)
  new_m, params = atoms.remove_atoms(m, params, kept)
  layers = [
    {
      "block": block,
      "experts": int(mask.shape[0]),
      "kept_atoms": [int(n) for n in mask.sum(axis=1)],
    }
    for block, mask in kept.items()
  ]
  return new_m, params, rest, layers


def prune_model(
  m,
  params: dict,
  rest: dict,
  windows: np.ndarray | None = None,
  *,
  keep: str,
  method: str,
  objective: str = "rescaled",
  seed: int = 0,
  batch_size: int = 8,
  rescale: bool = False,
  calibration: Calibration | None = None,
  save_statistics: str | None = None,
  merge: str = "",
  partner: str = "output",
  normalisation: str = "routed",
  deployed: bool = False,
):
  """(pruned model config, params, rest, per-layer report) of the model config `m`
  (loop layout) calibrated on token windows [N, L] (or a shared `calibration`);
  pure-dict params and rest. Atom pruners (methods.PRUNERS) keep a fraction of
  every layer's atoms together; the others keep experts per layer, then merge the
  pruned into the kept by `merge` (MERGES, with partners by `partner`) and with
  `rescale` fold the rescaled objective's least-squares weights into the kept.
  Per layer the report gives `relative_error`, err(S) / err(empty) of the objective
  (the proxy: dropped experts' outputs vanish, the others keep their gates), and
  with `deployed` `deployed_error`, the pruned layer's own error on the same
  tokens, re-routed and renormalised, over the same ||Y||^2
  (contributions.deployed_errors).
  save_statistics: write the expert statistics there (.npz) as well."""
  check_options(Pruning(method, keep, objective, rescale, seed, merge, partner, normalisation))
  if calibration is None:
    if windows is None:
      raise ValueError("prune_model needs token windows or a calibration")
    calibration = Calibration(m, params, rest, windows, batch_size)
  if save_statistics:
    contributions.save_statistics(save_statistics, calibration.stats)
  pruner = methods.PRUNERS.get(method)
  if pruner.kind == "atom":
    new_m, new_params, new_rest, layers = prune_atoms(
      m, params, rest, calibration, keep=keep, method=method, seed=seed, normalisation=normalisation
    )
  else:
    stats = calibration.with_step_scores() if "step_score" in pruner.needs else calibration.stats
    kept, errors = choose_experts(stats, keep, m.moe.top_k, method, objective, seed)
    scales = (
      {layer.block: expert_subset.rescale_weights(layer.gram, kept[layer.block]) for layer in stats}
      if rescale
      else None
    )
    merged = params
    if merge_rule(method, merge) == "average":
      for layer in stats:
        similarity = layer.outputs if partner == "output" else layer.gram
        merged = merge_in_layer(
          merged, layer.block, most_similar_kept(similarity, kept[layer.block]), layer.mass
        )
    new_m, new_params, new_rest = surgery.remove_experts(m, merged, rest, kept, scales)
    layers = [
      {
        "block": layer.block,
        "experts": len(layer.gram),
        "kept": list(kept[layer.block]),
        "relative_error": errors[layer.block],
      }
      for layer in stats
    ]
  if deployed:
    energy = {layer.block: max(float(layer.gram.sum()), 1e-300) for layer in calibration.stats}
    errors = contributions.deployed_errors(
      calibration.graphdef, params, rest, new_m, new_params, new_rest, calibration.batches
    )
    for layer in layers:
      layer["deployed_error"] = errors[layer["block"]] / energy[layer["block"]]
  return new_m, new_params, new_rest, layers
