"""A per-document paired bootstrap for the bpb difference of two models.

The statistic is the difference of two ratio estimates on the same documents,
bpb_a - bpb_b = sum(bits_a) / sum(bytes) - sum(bits_b) / sum(bytes).
One resample draws n documents with replacement (numpy's default_rng(seed));
both models are scored on that same resample (paired), so what the documents
share cancels. The interval is the bootstrap distribution's percentile
interval (numpy's linear-interpolation percentiles).
"""
import dataclasses
import math

import numpy as np

from moejax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Interval:
  difference: float  # on all documents: bpb_a - bpb_b
  mean: float  # of the resampled differences
  std: float  # of the resampled differences (ddof 0)
  low: float
  high: float
  confidence: float
  num_resamples: int
  num_documents: int

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def resample_indices(num_documents: int, num_resamples: int, seed: int) -> np.ndarray:
  """int64 [num_resamples, num_documents]: documents drawn with replacement."""
  return np.random.default_rng(seed).integers(0, num_documents, (num_resamples, num_documents))


def resampled_differences(nats_a, nats_b, num_bytes, indices: np.ndarray) -> np.ndarray:
  """float64 [R]: bpb_a - bpb_b on each resample (rows of `indices`)."""
  diff = (np.asarray(nats_a, np.float64) - np.asarray(nats_b, np.float64)) / math.log(2)
  return diff[indices].sum(1) / np.asarray(num_bytes, np.float64)[indices].sum(1)


def paired_bootstrap(nats_a, nats_b, num_bytes, *, num_resamples: int = 1000, seed: int = 0,
                     confidence: float = 0.95, indices: np.ndarray | None = None) -> Interval:
  """The paired bootstrap of bpb_a - bpb_b over documents (module doc).

  nats_*: float [n] per-document -sum log p; num_bytes: [n]. `indices`
  replaces the random resamples (e.g. every one of n**n, for an exact check)."""
  n = len(num_bytes)
  if not (len(nats_a) == len(nats_b) == n) or n == 0:
    raise ConfigError(f"paired bootstrap needs the same documents for both models, "
                      f"got {len(nats_a)} and {len(nats_b)} scores for {n} documents")
  if not 0 < confidence < 1:
    raise ConfigError(f"confidence={confidence} must be in (0, 1)")
  if indices is None:
    if num_resamples < 1:
      raise ConfigError(f"num_resamples={num_resamples} must be >= 1")
    indices = resample_indices(n, num_resamples, seed)
  samples = resampled_differences(nats_a, nats_b, num_bytes, indices)
  point = resampled_differences(nats_a, nats_b, num_bytes, np.arange(n)[None])[0]
  tail = 100 * (1 - confidence) / 2
  low, high = np.percentile(samples, [tail, 100 - tail])
  return Interval(float(point), float(samples.mean()), float(samples.std()), float(low),
                  float(high), confidence, len(samples), n)
