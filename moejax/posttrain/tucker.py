"""TD-MoE (ICLR 2026): one joint, whitened Tucker decomposition of a layer's experts.

One projection of E experts (moejax: y = x @ W_e) stacks into W [E, d_in, d_out].
With calibration inputs X [n, d_in] the error that matters is the activation
error sum_e ||X (W_e - W^_e)||_F^2. With C = X^T X / n + lambda I (lambda =
damping * mean(diag(X^T X / n)), or damping if that is 0) and S its lower
Cholesky factor, S S^T = C, exactly

  sum_e n ||S^T (W_e - W^_e)||_F^2 = sum_e ||X (W_e - W^_e)||_F^2 + n lambda ||W - W^||_F^2.

TD-MoE whitens the input mode, W~_e = S^T W_e, fits a Tucker model W~ ~ G x_E U_E
x_in U~_in x_out U_out (HOSVD, then HOOI sweeps) and un-whitens U_in = S^-T U~_in,
so W^_e = U_in G_e U_out^T with G_e = sum_k U_E[e, k] G[k]; at runtime a shared
x U_in, the expert's r_in x r_out mixing G_e, a shared U_out^T. Stored and
counted (`tucker_parameters`): G, U_E, U_in, U_out, r_E r_in r_out + E r_E +
d_in r_in + d_out r_out (materialised G_e would cost E r_in r_out instead of G, U_E).

Ranks within a parameter budget, per tensor as TD-MoE allocates them
(`tensor_budgets`: each stacked projection keeps its share of the ratio, never
more than its dense size, `capped_ranks`): `allocate_ranks` (exact) minimises the truncated
HOSVD's whitened error over every rank triple at once (`truncation_errors`: ||T||^2
minus the leading block energy of the full-basis HOSVD core; HOOI only lowers it).
`greedy` (the spec's "greedy on the mode spectra") and `allocate_layers` (several
tensors, one budget) add one rank at a time by the decrease of the HOSVD bound
sum_k sum_{i > r_k} sigma_{k,i}^2 (De Lathauwer et al. 2000), per added parameter or
not, keeping the better. All finish greedily until no single rank fits (maximal).

Guesses and differences (the paper's method section was not read; PAPERS.md entry
9): one input covariance shared by all experts (the caller picks the tokens: the
layer's inputs, or for w_down the pooled hidden activations); Cholesky whitening
(the Tangshengku/TD-MoE reimplementation uses C^1/2, the same objective up to a
rotation of the whitened input mode); output whitening (`output_samples` Y, the
projection's pooled outputs on its routed tokens: R R^T = Y^T Y / m,
W~_e = S^T W_e R, U_out = R^-T U~_out, the paper's multilinear whitening of both
feature modes); the rank rule (the reimplementation only matches a parameter
target); the HOOI sweeps.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.linalg

from moejax.errors import ConfigError

MODES = ("expert", "in", "out")
ALLOCATIONS = ("exact", "greedy")


def whitening(X, damping: float = 1e-6) -> np.ndarray:
  """Lower-triangular S [d, d] with S S^T = X^T X / n + lambda I (module doc).
  X [..., d]: leading axes are tokens."""
  x = np.asarray(X, np.float64)
  x = x.reshape(-1, x.shape[-1])
  if x.shape[0] == 0:
    raise ConfigError("whitening needs at least one calibration token; X has none")
  cov = x.T @ x / x.shape[0]
  scale = float(np.mean(np.diag(cov))) or 1.0
  return np.linalg.cholesky(cov + damping * scale * np.eye(len(cov)))


def whiten(W, S) -> np.ndarray:
  """W~ = W x_in S^T: W~_e = S^T W_e for W [E, d_in, d_out]."""
  return np.einsum("ij,eio->ejo", np.asarray(S, np.float64), np.asarray(W, np.float64))


def _unwhiten(S, factor):  # S^-T factor, S lower triangular
  return scipy.linalg.solve_triangular(S, factor, trans="T", lower=True)


def _check_ranks(shape, ranks) -> tuple[int, int, int]:
  if len(ranks) != 3:
    raise ConfigError(f"ranks={tuple(ranks)} must be 3 ranks (expert, in, out)")
  for mode, rank, dim in zip(MODES, ranks, shape):
    if not 1 <= rank <= dim or int(rank) != rank:
      raise ConfigError(
        f"rank {mode}={rank} must be an integer in [1, {dim}] for a tensor of shape {tuple(shape)}"
      )
  return int(ranks[0]), int(ranks[1]), int(ranks[2])


def tucker_parameters(shape, ranks) -> int:
  """r_E r_in r_out + E r_E + d_in r_in + d_out r_out: G, U_E, U_in, U_out."""
  (e, di, do), (re, ri, ro) = shape, ranks
  return int(re * ri * ro + e * re + di * ri + do * ro)


def reconstruct(core, expert_factor, input_factor, output_factor) -> np.ndarray:
  """W^ [E, d_in, d_out] = G x_E U_E x_in U_in x_out U_out."""
  return np.einsum(
    "abc,ea,ib,oc->eio", core, expert_factor, input_factor, output_factor, optimize=True
  )


@dataclasses.dataclass
class Tucker:
  core: np.ndarray  # G [r_E, r_in, r_out]
  expert_factor: np.ndarray  # U_E [E, r_E]
  input_factor: np.ndarray  # U_in [d_in, r_in]
  output_factor: np.ndarray  # U_out [d_out, r_out]

  @property
  def parameters(self) -> int:
    shape = (len(self.expert_factor), len(self.input_factor), len(self.output_factor))
    return tucker_parameters(shape, self.core.shape)

  @property
  def ranks(self) -> tuple[int, ...]:
    return tuple(int(r) for r in self.core.shape)

  def expert_cores(self) -> np.ndarray:
    """G_e = sum_k U_E[e, k] G[k], [E, r_in, r_out]: W^_e = U_in G_e U_out^T."""
    return np.einsum("ek,kab->eab", self.expert_factor, self.core)

  def reconstruct(self) -> np.ndarray:
    return reconstruct(self.core, self.expert_factor, self.input_factor, self.output_factor)


def _unfold(tensor, mode):
  return np.moveaxis(tensor, mode, 0).reshape(tensor.shape[mode], -1)


def _project(tensor, factors, skip=None):
  """tensor x_k U_k^T over every mode k but `skip`."""
  for mode, factor in enumerate(factors):
    if mode != skip:
      tensor = np.moveaxis(np.tensordot(tensor, factor, axes=(mode, 0)), -1, mode)
  return tensor


def _leading(matrix, rank):
  """The `rank` leading left singular vectors of `matrix`."""
  return np.linalg.svd(matrix, full_matrices=False)[0][:, :rank]


def mode_spectra(tensor) -> list[np.ndarray]:
  """Per mode, the squared singular values of the mode unfolding, descending,
  zero-padded to the mode's size."""
  t = np.asarray(tensor, np.float64)
  spectra = [np.linalg.svd(_unfold(t, k), compute_uv=False) ** 2 for k in range(3)]
  return [np.pad(s, (0, d - s.size)) for s, d in zip(spectra, t.shape)]


def tucker(tensor, ranks, iterations: int = 5) -> Tucker:
  """Tucker model of a 3-way tensor: HOSVD initialisation, then `iterations`
  HOOI sweeps (each never increases the error); orthonormal factors."""
  t = np.asarray(tensor, np.float64)
  ranks = _check_ranks(t.shape, ranks)
  factors = [_leading(_unfold(t, k), ranks[k]) for k in range(3)]
  for _ in range(iterations):
    for k in range(3):
      factors[k] = _leading(_unfold(_project(t, factors, skip=k), k), ranks[k])
  return Tucker(_project(t, factors), *factors)


def td_moe(
  W, X, ranks, *, output_samples=None, damping: float = 1e-6, iterations: int = 5
) -> Tucker:
  """TD-MoE of W [E, d_in, d_out] with calibration inputs X [n, d_in] (module doc):
  whitened joint Tucker, the input (and, given output_samples, output) factor
  un-whitened (no longer orthonormal) so that `reconstruct` approximates W."""
  S = whitening(X, damping)
  R = None if output_samples is None else whitening(output_samples, damping)
  wt = whiten(W, S) if R is None else np.einsum("ejo,ol->ejl", whiten(W, S), R)
  model = tucker(wt, ranks, iterations)
  model.input_factor = _unwhiten(S, model.input_factor)
  if R is not None:
    model.output_factor = _unwhiten(R, model.output_factor)
  return model


def spectral_bound(spectra, ranks) -> float:
  """sum_k sum_{i > r_k} sigma_{k,i}^2: the HOSVD bound on the Tucker error."""
  return float(sum(s[r:].sum() for s, r in zip(spectra, ranks)))


def _check_budget(shapes, budget) -> int:
  minimum = sum(tucker_parameters(s, (1, 1, 1)) for s in shapes)
  if not budget >= minimum:
    raise ConfigError(
      f"budget={budget} parameters is below the minimum {minimum} "
      f"(every rank 1) for tensors of shapes {[tuple(s) for s in shapes]}"
    )
  return int(budget)


def _greedy(shapes, spectra, ranks, budget, per_parameter: bool) -> list[tuple[int, int, int]]:
  """From `ranks`, add one rank at a time, the one of largest gain (the next
  squared singular value), per added parameter or not, until none fits."""
  ranks, dims = np.array(ranks, np.int64), np.array(shapes, np.int64)
  gain, cost = np.zeros(ranks.shape), np.zeros(ranks.shape, np.int64)

  def refresh(layer):
    base = tucker_parameters(dims[layer], ranks[layer])
    for k in np.flatnonzero(ranks[layer] < dims[layer]):
      bigger = ranks[layer] + np.eye(3, dtype=np.int64)[k]
      cost[layer, k] = tucker_parameters(dims[layer], bigger) - base
      gain[layer, k] = spectra[layer][k][ranks[layer, k]]

  for layer in range(len(ranks)):
    refresh(layer)
  left = budget - sum(tucker_parameters(d, r) for d, r in zip(dims, ranks))
  while ((ranks < dims) & (cost <= left)).any():
    score = np.where(
      (ranks < dims) & (cost <= left),
      gain / np.maximum(cost, 1) if per_parameter else gain,
      -np.inf,
    )
    layer, k = map(int, np.unravel_index(int(np.argmax(score)), score.shape))
    ranks[layer, k] += 1
    left -= cost[layer, k]
    refresh(layer)
  return [(int(row[0]), int(row[1]), int(row[2])) for row in ranks]


def _best_greedy(shapes, spectra, ranks, budget):
  """The greedy of the lower total spectral_bound, by gain per parameter or by gain
  (neither order is better on every tensor)."""
  return min(
    (_greedy(shapes, spectra, ranks, budget, rule) for rule in (True, False)),
    key=lambda out: sum(spectral_bound(s, r) for s, r in zip(spectra, out)),
  )


def truncation_errors(tensor) -> np.ndarray:
  """err [E+1, d_in+1, d_out+1]: err[r_E, r_in, r_out] is the truncated HOSVD's
  error at those ranks (HOOI's start), every triple at once (module doc)."""
  t = np.asarray(tensor, np.float64)
  core = _project(t, [_leading(_unfold(t, k), t.shape[k]) for k in range(3)])
  energy = (core**2).cumsum(0).cumsum(1).cumsum(2)
  energy = np.pad(energy, [(0, d - n) for d, n in zip(t.shape, energy.shape)], mode="edge")
  energy = np.pad(energy, [(1, 0)] * 3)
  return np.maximum(np.sum(t**2) - energy, 0.0)


def dense_parameters(shape) -> int:
  """E d_in d_out: the stacked experts stored dense."""
  return int(np.prod(shape))


def allocate_ranks(W_whitened, budget: int, method: str = "exact") -> tuple[int, int, int]:
  """(r_E, r_in, r_out) with tucker_parameters <= min(budget, dense size) and
  maximal (no single rank fits one more): of least truncation_errors (`exact`),
  or by the greedy rule on the mode spectra (module doc). A factorisation never
  costs more than the dense tensor (TD-MoE keeps it dense instead)."""
  if method not in ALLOCATIONS:
    from moejax.errors import choice_error

    raise choice_error("method", method, ALLOCATIONS)
  shape = np.shape(W_whitened)
  budget = min(_check_budget([shape], budget), dense_parameters(shape))
  spectra = mode_spectra(W_whitened)
  if method == "greedy":
    return _best_greedy([shape], [spectra], [(1, 1, 1)], budget)[0]
  e, di, do = shape
  r_e, r_in = np.arange(1, e + 1)[:, None], np.arange(1, di + 1)[None, :]
  r_out = np.minimum(do, (budget - e * r_e - di * r_in) // (r_e * r_in + do))
  error = truncation_errors(W_whitened)[r_e, r_in, np.maximum(r_out, 1)]
  i, j = np.unravel_index(int(np.argmin(np.where(r_out >= 1, error, np.inf))), error.shape)
  return _greedy([shape], [spectra], [(i + 1, j + 1, int(r_out[i, j]))], budget, True)[0]


def capped_ranks(W_whitened, ranks) -> tuple[int, int, int]:
  """`ranks` if their Tucker model costs no more than the dense tensor, else the
  best ranks within the dense size (allocate_ranks): full ranks cost
  E d_in d_out + E^2 + d_in^2 + d_out^2, more than dense."""
  shape = np.shape(W_whitened)
  ranks = _check_ranks(shape, ranks)
  if tucker_parameters(shape, ranks) <= dense_parameters(shape):
    return ranks
  return allocate_ranks(W_whitened, dense_parameters(shape))


def tensor_budgets(shapes, removed: float) -> list[int]:
  """TD-MoE's allocation is per tensor: each stacked projection keeps
  floor((1 - removed) x its dense size) parameters."""
  return [int((1 - removed) * dense_parameters(s)) for s in shapes]


def allocate_layers(tensors, budget: int) -> list[tuple[int, int, int]]:
  """Ranks for several (whitened) tensors sharing one parameter budget: greedy
  from all ranks 1 (module doc); the total is <= budget and maximal."""
  shapes = [np.shape(t) for t in tensors]
  budget = _check_budget(shapes, budget)
  return _best_greedy(shapes, [mode_spectra(t) for t in tensors], [(1, 1, 1)] * len(shapes), budget)


def compress(W, X, budget: int, damping: float = 1e-6, iterations: int = 5) -> Tucker:
  """td_moe at the ranks allocate_ranks picks for the whitened W within `budget`."""
  ranks = allocate_ranks(whiten(W, whitening(X, damping)), budget)
  return td_moe(W, X, ranks, damping=damping, iterations=iterations)


@dataclasses.dataclass
class LowRank:
  """Per-expert factors: W^_e = left[e] @ right[e]."""

  left: np.ndarray  # [E, d_in, r]
  right: np.ndarray  # [E, r, d_out]

  @property
  def parameters(self) -> int:
    return int(self.left.size + self.right.size)

  @property
  def ranks(self) -> int:
    return int(self.left.shape[-1])

  def reconstruct(self) -> np.ndarray:
    return self.left @ self.right


def svd_parameters(shape, rank) -> int:
  """E r (d_in + d_out): per-expert rank-r factors."""
  return int(shape[0] * rank * (shape[1] + shape[2]))


def svd_rank_for_budget(shape, budget) -> int:
  """The largest per-expert rank with svd_parameters <= min(budget, the dense size):
  factors never cost more than the experts stored dense."""
  within = min(int(budget), dense_parameters(shape))
  rank = min(within // svd_parameters(shape, 1), min(shape[1], shape[2]))
  if rank < 1:
    raise ConfigError(
      f"budget={budget} parameters is below one rank per expert, "
      f"{svd_parameters(shape, 1)}, for shape {tuple(shape)}"
    )
  return rank


def _per_expert_svd(W, rank, S=None) -> LowRank:
  w = np.asarray(W, np.float64)
  if not 1 <= rank <= min(w.shape[1:]) or int(rank) != rank:
    raise ConfigError(
      f"rank={rank} must be an integer in [1, {min(w.shape[1:])}] for "
      f"experts of shape {tuple(w.shape[1:])}"
    )
  u, s, vt = np.linalg.svd(w if S is None else whiten(w, S), full_matrices=False)
  left = u[:, :, :rank] * s[:, None, :rank]
  if S is not None:
    left = np.stack([_unwhiten(S, part) for part in left])
  return LowRank(left, vt[:, :rank])


def per_expert_svd(W, rank: int) -> LowRank:
  """Baseline: each expert's best rank-r approximation in Frobenius norm."""
  return _per_expert_svd(W, rank)


def whitened_per_expert_svd(W, X, rank: int, damping: float = 1e-6) -> LowRank:
  """Baseline (SVD-LLM style): truncated SVD of S^T W_e, un-whitened; with
  damping 0 and X of full column rank, the best rank-r W^_e for the activation error."""
  return _per_expert_svd(W, rank, whitening(X, damping))


def activation_error(W, W_hat, X) -> float:
  """sum_e ||X W_e - X W^_e||_F^2, computed directly."""
  x = np.asarray(X, np.float64).reshape(-1, np.shape(W)[1])
  diff = np.asarray(W, np.float64) - np.asarray(W_hat, np.float64)
  return float(sum(np.sum((x @ d) ** 2) for d in diff))


def whitened_error(W, W_hat, S) -> float:
  """sum_e ||S^T (W_e - W^_e)||_F^2."""
  return float(np.sum(whiten(np.asarray(W, np.float64) - np.asarray(W_hat, np.float64), S) ** 2))
