"""Agreement between two partitions of the same points (label arrays, any label
names): normalised mutual information and the adjusted Rand index. Used by the
routing reports (language vs top-1 expert) and the clustering studies
(moejax/mixtures/)."""

import numpy as np

from moejax.errors import ConfigError


def contingency(labels_a, labels_b) -> np.ndarray:
  """Counts [A, B] of points with label pair (a, b); ConfigError unless both are
  non-empty [n] arrays of one length."""
  a, b = np.ravel(labels_a), np.ravel(labels_b)
  if np.ndim(labels_a) != 1 or np.shape(labels_a) != np.shape(labels_b) or a.size == 0:
    raise ConfigError(
      f"expected two non-empty [n] labelings of one length "
      f"(shapes={np.shape(labels_a)}, {np.shape(labels_b)})"
    )
  _, ia = np.unique(a, return_inverse=True)
  _, ib = np.unique(b, return_inverse=True)
  counts = np.zeros((ia.max() + 1, ib.max() + 1))
  np.add.at(counts, (ia, ib), 1.0)
  return counts


def nmi(labels_a, labels_b) -> float:
  """Normalised mutual information I(A;B) / ((H(A) + H(B)) / 2) (sklearn's
  arithmetic normalisation): 1 for the same partition under any renaming (both
  constant included), 0 for independent labelings."""
  joint = contingency(labels_a, labels_b)
  joint /= joint.sum()
  pa, pb = joint.sum(1), joint.sum(0)
  if pa.size == pb.size == 1:
    return 1.0
  nz = joint > 0
  mi = max(float((joint[nz] * np.log(joint[nz] / np.outer(pa, pb)[nz])).sum()), 0.0)

  def entropy(p):
    return float(-(p[p > 0] * np.log(p[p > 0])).sum())

  return min(mi / ((entropy(pa) + entropy(pb)) / 2), 1.0) if mi > 0 else 0.0


def adjusted_rand_index(truth, pred) -> float:
  """ARI (Hubert and Arabie 1985): pair-counting agreement corrected for chance,
  from the contingency table; 1 for equal partitions up to renaming."""
  table = contingency(truth, pred)

  def pairs(m):
    return m * (m - 1) / 2

  n = table.sum()
  index, rows, cols = pairs(table).sum(), pairs(table.sum(1)).sum(), pairs(table.sum(0)).sum()
  expected = rows * cols / pairs(n) if n > 1 else 0.0
  best = (rows + cols) / 2
  return 1.0 if best == expected else float((index - expected) / (best - expected))
