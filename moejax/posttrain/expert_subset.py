"""Which m of a layer's E experts to keep: SCHUR-A* and its baselines.

SCHUR-A* (ICML 2026; only the abstract was read, the formulation below follows
/work/shared/specs/PAPERS.md, ICML entry 1). On calibration tokens, expert e's
contribution to the layer output is Z_e = [g_{t,e} E_e(x_t)]_t (zero where e
is not routed) and the layer output is Y = sum_e Z_e. With the Gram matrix
G_ij = <Z_i, Z_j> and b_i = <Z_i, Y> = (G 1)_i:

  rescaled (least squares):  err(S) = min_a ||Y - sum_{e in S} a_e Z_e||^2
                                    = ||Y||^2 - b_S^T G_SS^+ b_S,
  no rescale:                err(S) = ||sum_{e not in S} Z_e||^2 = 1_D^T G 1_D,  D = not S.

The search decides include / exclude for the experts in a fixed order (best
single-expert energy first) and expands the node of least f, a lower bound on
err of every completion with |S| = m:

  rescaled: f = err(S u U), U the undecided experts. Least squares on a superset
    explains at least as much (the spec's Schur-complement bound, relaxing the
    cardinality: E(S u U) = E(S) + r_U^T (G_UU - G_US G_SS^-1 G_SU)^-1 r_U).
  no rescale (our own bound, not from the paper): the dropped vector is
    z_D + sum_{e in Q} Z_e for some Q in U; relaxing Q's 0/1 weights to any real
    weights gives f = ||z_D||^2 - c_U^T G_UU^+ c_U with c_U = G_UD 1, the
    residual of z_D off span(Z_U) (again a Schur complement).

Both are exact at a complete node, so the first complete node popped is optimal.
Guesses: the expert order, the tie-break (deeper node first), and the knee
(Kneedle on err(m), Satopaa et al. 2011) as the per-layer budget rule.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools

import numpy as np

from moejax.posttrain.methods import OBJECTIVES, PRUNERS
from moejax.posttrain.parts import lookup


def gram_of(contributions_ExN: np.ndarray) -> np.ndarray:
  """G from the flattened contributions Z [E, N] (N = tokens x d), in float64."""
  z = np.asarray(contributions_ExN, np.float64)
  return z @ z.T


def _explained(gram: np.ndarray, target: np.ndarray, subset) -> float:
  """t_S^T G_SS^+ t_S: the energy of the target's projection on span(Z_S), where
  t_i = <Z_i, target>. G_SS^+ through lstsq (a never-routed expert has Z = 0)."""
  idx = np.asarray(sorted(subset), np.int64)
  if idx.size == 0:
    return 0.0
  t = target[idx]
  solution = np.linalg.lstsq(gram[np.ix_(idx, idx)], t, rcond=None)[0]
  return float(t @ solution)


def subset_error(gram: np.ndarray, keep, objective: str = "rescaled") -> float:
  """err(S) of the module doc for the kept experts `keep`."""
  gram = np.asarray(gram, np.float64)
  keep = set(int(e) for e in keep)
  if objective == "rescaled":
    b = gram.sum(axis=1)
    return max(float(b.sum()) - _explained(gram, b, keep), 0.0)
  if objective == "no_rescale":
    dropped = np.asarray([e for e in range(len(gram)) if e not in keep], np.int64)
    return float(gram[np.ix_(dropped, dropped)].sum())
  raise ValueError(f"objective={objective!r}: expected one of {OBJECTIVES}")


def rescale_weights(gram: np.ndarray, keep) -> np.ndarray:
  """The least-squares weights a_S of the rescaled objective, in sorted(keep) order."""
  gram = np.asarray(gram, np.float64)
  idx = np.asarray(sorted(keep), np.int64)
  b = gram.sum(axis=1)
  return np.linalg.lstsq(gram[np.ix_(idx, idx)], b[idx], rcond=None)[0]


def lower_bound(gram: np.ndarray, included, undecided, excluded, objective: str) -> float:
  """f of a search node: a lower bound on err(S) over every S with
  included <= S <= included | undecided (module doc)."""
  if objective == "rescaled":
    return subset_error(gram, set(included) | set(undecided), "rescaled")
  dropped = np.asarray(sorted(excluded), np.int64)
  if dropped.size == 0:
    return 0.0
  c = gram[:, dropped].sum(axis=1)  # c_i = <Z_i, z_D>
  energy = float(c[dropped].sum())  # ||z_D||^2
  return max(energy - _explained(gram, c, undecided), 0.0)


@dataclasses.dataclass
class SearchResult:
  keep: tuple[int, ...]
  error: float
  expanded: int  # nodes popped and expanded
  generated: int  # nodes pushed
  trace: list | None = None  # (included, undecided, excluded, f) of each expanded node


def astar(
  gram,
  m: int,
  objective: str = "rescaled",
  *,
  order=None,
  max_expanded: int = 10**7,
  record_trace: bool = False,
) -> SearchResult:
  """The m experts of least err(S), by A* over include/exclude decisions (module doc)."""
  gram = np.asarray(gram, np.float64)
  num = len(gram)
  if not 0 < m <= num:
    raise ValueError(f"m={m}: expected 1 <= m <= E={num}")
  if objective not in OBJECTIVES:
    raise ValueError(f"objective={objective!r}: expected one of {OBJECTIVES}")
  if order is None:  # best single expert first: its explained energy b_i^2 / G_ii
    b = gram.sum(axis=1)
    single = np.where(np.diag(gram) > 0, b * b / np.maximum(np.diag(gram), 1e-300), 0.0)
    order = list(np.argsort(-single, kind="stable"))
  order = [int(e) for e in order]
  tie = itertools.count()
  heap: list[tuple[float, int, int, tuple[int, ...], tuple[int, ...]]] = [
    (lower_bound(gram, (), order, (), objective), 0, next(tie), (), ())
  ]
  expanded = 0
  trace: list | None = [] if record_trace else None
  while heap:
    f, neg_depth, _, included, excluded = heapq.heappop(heap)
    depth = -neg_depth
    if len(included) == m:  # complete: every undecided expert excluded; f is exact
      return SearchResult(tuple(sorted(included)), f, expanded, next(tie), trace)
    undecided = order[depth:]
    expanded += 1
    if trace is not None:
      trace.append((included, tuple(undecided), excluded, f))
    if expanded > max_expanded:
      raise RuntimeError(f"A* expanded {max_expanded} nodes without finishing (E={num}, m={m})")
    expert, rest = undecided[0], undecided[1:]
    children: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    if len(included) < m:
      children.append((included + (expert,), excluded))
    if len(included) + len(rest) >= m:
      children.append((included, excluded + (expert,)))
    for inc, exc in children:
      if len(inc) == m:  # the rest are excluded
        exc = exc + tuple(rest)
        key = (subset_error(gram, inc, objective), -num)
      elif len(inc) + len(rest) == m:  # the rest must be included
        inc, key = inc + tuple(rest), (subset_error(gram, inc + tuple(rest), objective), -num)
      else:
        key = (lower_bound(gram, inc, rest, exc, objective), -(depth + 1))
      heapq.heappush(heap, (key[0], key[1], next(tie), inc, exc))
  raise AssertionError("the search space ran out without a complete node")


def brute_force(gram, m: int, objective: str = "rescaled") -> tuple[tuple[int, ...], float]:
  """The best subset by enumerating all C(E, m): the oracle for astar."""
  best = min(
    ((subset_error(gram, s, objective), s) for s in itertools.combinations(range(len(gram)), m))
  )
  return best[1], best[0]


def greedy_forward(gram, m: int, objective: str = "rescaled") -> tuple[int, ...]:
  """Add, m times, the expert whose inclusion lowers err(S) most."""
  keep: list[int] = []
  for _ in range(m):
    candidates = [e for e in range(len(gram)) if e not in keep]
    keep.append(min(candidates, key=lambda e: subset_error(gram, keep + [e], objective)))
  return tuple(sorted(keep))


def top_by_score(scores, m: int) -> tuple[int, ...]:
  """The m experts of largest score (ties: lower index): the ranking baselines
  (routing frequency, router mass, output energy diag(G), a random score)."""
  order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
  return tuple(sorted(int(e) for e in order[:m]))


def knee(errors) -> int:
  """Kneedle on a decreasing err(m), m = 1..len(errors): the m farthest below the
  chord from the first to the last point, both axes scaled to [0, 1]."""
  y = np.asarray(errors, np.float64)
  if y.size <= 2:
    return int(y.size)
  x = np.linspace(0.0, 1.0, y.size)
  span = y[0] - y[-1]
  y = (y - y[-1]) / span if span > 0 else np.zeros_like(y)
  below_chord = (1.0 - x) - y
  return int(np.argmax(below_chord)) + 1


# The expert pruners (methods.PRUNERS, kind 'expert'): select(stats, m, **settings)
# -> the m experts one layer keeps, from its calibration statistics
# (contributions.LayerStatistics).


def select_astar(stats, m: int, objective: str = "rescaled") -> tuple[int, ...]:
  """SCHUR-A*: the subset of least err(S) of `objective` (optimal)."""
  return astar(stats.gram, m, objective).keep


def select_greedy(stats, m: int, objective: str = "rescaled") -> tuple[int, ...]:
  return greedy_forward(stats.gram, m, objective)


def select_step(stats, m: int) -> tuple[int, ...]:
  """Step: the top m by token-selective score (stats.step_score, posttrain/taylor.py)."""
  if stats.step_score is None:
    raise ValueError("method 'step' needs the layer's step_score (posttrain/taylor.py)")
  return top_by_score(stats.step_score, m)


def select_frequency(stats, m: int) -> tuple[int, ...]:
  return top_by_score(stats.frequency, m)


def select_mass(stats, m: int) -> tuple[int, ...]:
  return top_by_score(stats.mass, m)


def select_output_norm(stats, m: int) -> tuple[int, ...]:
  """The top m by output energy diag(G)."""
  return top_by_score(np.diag(stats.gram), m)


def select_random(stats, m: int, seed: int = 0) -> tuple[int, ...]:
  """The top m by a random score drawn with [seed, stats.block] (each layer its own)."""
  return top_by_score(np.random.default_rng([seed, stats.block]).random(len(stats.gram)), m)


def choose(stats, m: int, method: str, objective: str = "rescaled", seed: int = 0):
  """The m experts the expert pruner `method` (methods.PRUNERS) keeps in one layer,
  with `objective` and `seed` where the method has them as settings."""
  select = lookup(PRUNERS, method, "method", kind="expert")
  return select.bind_from({"objective": objective, "seed": seed})(stats, m)
