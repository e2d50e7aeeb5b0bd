"""RandOpt (Neural Thickets, arXiv 2603.12228, Algorithm 1): sample N Gaussian
perturbations of a checkpoint, score each on a selection set, keep the top K and
answer by majority vote of their greedy predictions.

  perturb      theta_i = theta + sigma * rms(W) * eps_i per tensor W, eps_i ~ N(0, I),
               rms(W) = ||W|| / sqrt(numel(W)). The paper's code perturbs
               isotropically (theta + sigma eps, sigma absolute); scaling sigma by each
               tensor's RMS norm is our choice (the spec says "relative to each tensor's
               norm"; the exact form is a guess). Member i's noise comes from
               fold_in(key, i), so a member is the same whatever the chunking; sigma = 0
               returns theta itself.
  top_k        the K best selection scores; ties go to the lower member index (a stable
               sort of -score: numpy.argsort(-score, kind="stable")[:K]).
  majority_vote  per example the most frequent prediction among the K members; a tie
               goes to the tied prediction of the best-ranked member (the paper's
               collections.Counter order does the same).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError


def check(n: int, k: int, sigma: float, keys: dict | None = None) -> None:
  """ConfigError naming the value for N < 1, K < 1, K > N, or sigma < 0 (or not finite)."""
  keys = {"n": "n", "k": "k", "sigma": "sigma", **(keys or {})}
  if not isinstance(n, int) or n < 1:
    raise ConfigError(f"{keys['n']}={n!r} must be an integer >= 1 (perturbations)")
  if not isinstance(k, int) or k < 1:
    raise ConfigError(f"{keys['k']}={k!r} must be an integer >= 1 (members of the vote)")
  if k > n:
    raise ConfigError(
      f"{keys['k']}={k} is larger than {keys['n']}={n}: the vote keeps the top K of N perturbations"
    )
  if not np.isfinite(sigma) or sigma < 0:
    raise ConfigError(
      f"{keys['sigma']}={sigma!r} must be a finite number >= 0 (the "
      "perturbation scale, relative to each tensor's RMS)"
    )


def perturb(params, key, index, sigma: float):
  """Member `index`'s parameters (module doc); traceable in `index` and `sigma` (a
  Python 0 returns `params` itself)."""
  if isinstance(sigma, (int, float)) and sigma == 0:
    return params
  member = jax.random.fold_in(key, index)
  leaves, treedef = jax.tree.flatten(params)
  out = []
  for i, leaf in enumerate(leaves):
    leaf = jnp.asarray(leaf)
    eps = jax.random.normal(jax.random.fold_in(member, i), leaf.shape, jnp.float32)
    rms = jnp.sqrt(jnp.mean(jnp.square(leaf.astype(jnp.float32))))
    out.append((leaf + sigma * rms * eps).astype(leaf.dtype))
  return jax.tree.unflatten(treedef, out)


def chunks(n: int, size: int) -> list[np.ndarray]:
  """Member indices 0..n-1 in chunks of `size` (the last one padded by repeating its
  last index, so every chunk has one shape; `trim` drops the padding)."""
  out = []
  for start in range(0, n, size):
    idx = np.arange(start, min(start + size, n), dtype=np.int32)
    out.append(np.concatenate([idx, np.full(size - idx.size, idx[-1], np.int32)]))
  return out


def top_k(scores, k: int) -> np.ndarray:
  """int [k]: members by descending score, ties to the lower index (module doc)."""
  scores = np.asarray(scores, np.float64)
  check(scores.size, k, 0.0)
  return np.argsort(-scores, kind="stable")[:k]


def majority_vote(predictions) -> np.ndarray:
  """[M, ...]: per example the majority of predictions [K, M, ...] of the K members in
  rank order (a prediction is the row predictions[k, m], e.g. a choice index or a
  token sequence); ties to the best-ranked member's prediction."""
  predictions = np.asarray(predictions)
  if predictions.ndim < 2 or predictions.shape[0] < 1:
    raise ConfigError(
      f"majority_vote needs predictions [K >= 1, M, ...], got shape {predictions.shape}"
    )
  out = np.empty(predictions.shape[1:], predictions.dtype)
  for m in range(predictions.shape[1]):
    rows = [predictions[k, m].tobytes() for k in range(predictions.shape[0])]
    counts = collections.Counter(rows)
    best = max(counts.values())
    winner = next(k for k, row in enumerate(rows) if counts[row] == best)
    out[m] = predictions[winner, m]
  return out
