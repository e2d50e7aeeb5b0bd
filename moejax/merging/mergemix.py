"""MergeMix (Wang et al., arXiv 2601.17858, its parameter-space merging step): the
merge of K domain experts, fine-tuned from one base for a short horizon, as a proxy
for training on a data mixture. For mixture weights alpha on the simplex Delta^{K-1},

    theta(alpha) = base + sum_k alpha_k (theta_k - base)

(the paper's Theta_merge(alpha): task arithmetic at scale 1, moejax/merging/
task_arithmetic.py, with simplex weights), and the merged model's score on held-out
data stands in for the score of a model trained on the mixture alpha. At a vertex
e_k it returns expert k bit for bit (the sum is arranged so), so the proxy's score
there is the expert's.

Registered as the merge method `mergemix` (weights refused off the simplex), so
`python -m experiments.merge --method=mergemix --weights=...` merges workdirs and HF
checkpoints. The search parts:

  simplex_grid(k, resolution)  every alpha whose entries are multiples of
                               1 / resolution: C(resolution + k - 1, k - 1) points
  proxy_scores                 the score of theta(alpha) for each alpha of a grid
  best_mixture                 the grid point of the lowest score (ties: the first)
  rank_agreement               Spearman's rho of proxy and trained scores
                               (scipy.stats.spearmanr), the paper's rank consistency
  sample_mixtures              the uniform mixture, then Dirichlet(1) draws: the
                               mixtures a study trains to test the proxy against
  check_domains                the K expert domains: known, distinct, K <= N

The paper optimises alpha against downstream benchmarks; here the score is a
held-out loss and the search an exhaustive grid (our choice for small K).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from moejax.errors import ConfigError
from moejax.merging.base import bind, map_leaves, register_merge, weighted_sum


@register_merge("mergemix", simplex=True)
def mergemix(base, models, weights, settings):
  """theta(alpha) = base + sum_k alpha_k (theta_k - base), alpha = weights, computed as
  sum_k alpha_k theta_k + (1 - sum_k alpha_k) base: the same on the simplex, and a
  vertex returns its expert bit for bit in any float dtype (base + (theta_k - base)
  rounds in float64)."""
  del settings
  w = np.asarray(weights, np.float64)
  return map_leaves(lambda b, ms: weighted_sum(w, ms) + (1.0 - w.sum()) * b, base, models)


def positive_int(value, key: str) -> int:
  """`value` if it is an integer >= 1; else a ConfigError naming `key=value`."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ConfigError(f"{key}={value!r} must be an integer >= 1")
  return int(value)


def simplex_grid(k: int, resolution: int) -> np.ndarray:
  """float64 [C(resolution + k - 1, k - 1), k]: every point of the simplex whose
  entries are multiples of 1 / resolution, in lexicographic order of the counts
  (the last vertex e_{k-1} first, e_0 last)."""
  k, resolution = positive_int(k, "k"), positive_int(resolution, "resolution")

  def counts(parts: int, total: int):
    if parts == 1:
      yield (total,)
      return
    for first in range(total + 1):
      for rest in counts(parts - 1, total - first):
        yield (first,) + rest

  return np.asarray(list(counts(k, resolution)), np.float64) / resolution


def sample_mixtures(k: int, n: int, seed: int) -> np.ndarray:
  """float64 [n, k]: the uniform mixture, then n - 1 draws of Dirichlet(1, ..., 1)
  (uniform on the simplex) from numpy default_rng(seed)."""
  k, n = positive_int(k, "k"), positive_int(n, "mixtures")
  rng = np.random.default_rng(seed)
  draws = rng.dirichlet(np.ones(k), size=n - 1)
  return np.concatenate([np.full((1, k), 1.0 / k), draws])


def mixture_params(base: dict, experts: list, alpha, names: list[str] | None = None) -> dict:
  """theta(alpha) of the experts over `base` (pure-dict trees); ConfigError for alpha
  off the simplex, a weight count other than K, or experts of another shape (the
  first differing parameter named)."""
  return bind("mergemix")(base, experts, alpha, names=names)


def proxy_scores(base: dict, experts: list, mixtures, score: Callable[[dict], float]) -> np.ndarray:
  """float64 [M]: score(theta(alpha_m)) for each row alpha_m of `mixtures` [M, K]."""
  mixtures = np.asarray(mixtures, np.float64)
  if mixtures.ndim != 2 or mixtures.shape[1] != len(experts):
    raise ConfigError(
      f"mixtures of shape {mixtures.shape} do not give one weight per expert ({len(experts)})"
    )
  return np.asarray([score(mixture_params(base, experts, alpha)) for alpha in mixtures], np.float64)


def best_mixture(mixtures, scores) -> np.ndarray:
  """The row of `mixtures` with the lowest score (a loss); ties go to the first."""
  scores = np.asarray(scores, np.float64)
  if scores.size == 0 or not np.all(np.isfinite(scores)):
    raise ConfigError(f"scores {scores.tolist()} must be non-empty and finite")
  return np.asarray(mixtures, np.float64)[int(np.argmin(scores))]


def rank_agreement(proxy, trained) -> float:
  """Spearman's rho between the proxy's and the trained models' scores over the same
  mixtures (scipy.stats.spearmanr; average ranks for ties); NaN if either is constant."""
  import scipy.stats

  proxy, trained = np.asarray(proxy, np.float64), np.asarray(trained, np.float64)
  if proxy.shape != trained.shape or proxy.ndim != 1 or proxy.size < 3:
    raise ConfigError(
      f"rank agreement needs one proxy and one trained score per mixture, at least 3; "
      f"got shapes {proxy.shape} and {trained.shape}"
    )
  if np.ptp(proxy) == 0 or np.ptp(trained) == 0:
    return float("nan")
  return float(scipy.stats.spearmanr(proxy, trained).statistic)


def check_domains(domains: Sequence[str], available: Sequence[str], key: str = "domains") -> list:
  """The K expert domains as a list: each one of the corpus's N domains, none twice,
  K <= N; else a ConfigError naming `key` and the value."""
  domains, available = list(domains), list(available)
  if not domains:
    raise ConfigError(f"{key}=[] must name at least one domain; the corpus has {available}")
  if len(domains) > len(available):
    raise ConfigError(
      f"{key}={domains} asks for K={len(domains)} experts, but the corpus has only "
      f"N={len(available)} domains ({', '.join(available)})"
    )
  for domain in domains:
    if domain not in available:
      raise ConfigError(
        f"{key}: {domain!r} is not a domain of the corpus; domains: {', '.join(available)}"
      )
  repeated = [d for i, d in enumerate(domains) if d in domains[:i]]
  if repeated:
    raise ConfigError(f"{key}={domains} names {repeated[0]!r} twice")
  return domains
