"""TIES-merging (Yadav et al., arXiv 2306.01708, Algorithm 1): for task vectors
tau_i = theta_i - base,

  1. trim: keep the `density` fraction of each tau_i's entries of largest magnitude
     (over the whole model, as the paper's code does; the k-th largest |tau| is the
     threshold and entries equal to it are kept), zero the rest;
  2. elect: gamma = sign(sum_i w_i trimmed tau_i) per entry (the sign of the larger
     summed mass);
  3. disjoint mean: per entry, the w-weighted mean of the trimmed tau_i whose sign
     is gamma (zeros excluded; none: 0);

    theta = base + scale * merged tau.

Weights lie on the simplex (uniform by default: the paper's unweighted mean); the
weighting of steps 2 and 3 is ours (the paper has none).
"""

import math

import numpy as np

from moejax.merging.base import finite_number, leaves, map_paths, register_merge


def _validate(settings: dict) -> None:
  finite_number(settings, "density", low=0.0, high=1.0, low_open=True)
  finite_number(settings, "scale", low=0.0, low_open=True)


def trim_threshold(task_vector: list[np.ndarray], density: float) -> float:
  """|tau| of the k-th largest entry over all leaves, k = ceil(density * n) (>= 1)."""
  magnitudes = np.concatenate([np.abs(leaf).reshape(-1) for leaf in task_vector])
  k = max(1, math.ceil(density * magnitudes.size))
  return float(np.partition(magnitudes, magnitudes.size - k)[magnitudes.size - k])


def ties_task_vector(taus: np.ndarray, weights: np.ndarray) -> np.ndarray:
  """Steps 2-3 on trimmed task vectors stacked [n, ...]: the merged task vector."""
  w = np.asarray(weights, np.float64).reshape((-1,) + (1,) * (taus.ndim - 1))
  sign = np.sign((w * taus).sum(0))
  agree = (np.sign(taus) == sign) & (taus != 0)
  mass = (w * agree).sum(0)
  return np.where(mass > 0, (w * taus * agree).sum(0) / np.where(mass > 0, mass, 1.0), 0.0)


@register_merge("ties", settings={"density": 0.2, "scale": 1.0}, validate=_validate, simplex=True)
def ties(base, models, weights, settings):
  base_leaves = dict(leaves(base))
  taus = [
    [
      np.asarray(dict(leaves(m))[p], np.float64) - np.asarray(b, np.float64)
      for p, b in base_leaves.items()
    ]
    for m in models
  ]
  thresholds = [trim_threshold(tau, float(settings["density"])) for tau in taus]
  scale = float(settings["scale"])

  def merge(path, b, ms):
    trimmed = np.stack([np.where(np.abs(m - b) >= t, m - b, 0.0) for m, t in zip(ms, thresholds)])
    return b + scale * ties_task_vector(trimmed, weights)

  return map_paths(merge, base, models)
