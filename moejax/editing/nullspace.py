"""MoEEdit's preservation constraint (arXiv 2602.10965, eq. of the update
W_j <- W_j + Delta_j P_j; the projector as in AlphaEdit, arXiv 2410.02355).

K0_j [n, f]: the keys (down-projection inputs) of expert j on preserved
tokens, one row each. P_j projects onto the null space of K0_j: with
C = K0^T K0 / n = U diag(s) U^T, the eigenvectors whose eigenvalue is at most
`tol` times the largest span it, and P = U_0 U_0^T. Then K0 P = 0 up to the
discarded eigenvalues (exactly, for tol below float64 rounding and K0 of rank
below f), so (W + Delta P) k0 = W k0 for every preserved key k0.

Guess: the tolerance is relative to the largest eigenvalue (AlphaEdit and the
MoEEdit code threshold the un-normalised eigenvalue at an absolute 2e-2), so
it does not depend on the scale of the keys.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Projector:
  """P [f, f] float64 onto the null space of one expert's preserved keys; `rank`
  of those keys (f - rank is the room left for edits) and how many there were."""

  matrix: np.ndarray
  rank: int
  num_keys: int

  @property
  def free(self) -> int:
    return self.matrix.shape[0] - self.rank


def null_space_projector(K0: np.ndarray, tol: float) -> Projector:
  """The projector onto the null space of the rows of K0 [n, f] (module doc):
  eigenvalues of K0^T K0 / n at most `tol` x the largest count as null. No
  keys (n = 0): the identity (nothing to preserve)."""
  K0 = np.asarray(K0, np.float64)
  if K0.ndim != 2:
    raise ConfigError(f"preserved keys must be [n, f], got shape {K0.shape}")
  if not 0 <= tol < 1:
    raise ConfigError(f"null-space tolerance {tol} must lie in [0, 1)")
  f = K0.shape[1]
  if K0.shape[0] == 0 or not np.any(K0):
    return Projector(np.eye(f), 0, K0.shape[0])
  # the right singular vectors of K0 are C's eigenvectors; s^2 / n its eigenvalues
  _, s, vt = np.linalg.svd(K0, full_matrices=True)
  eig = np.zeros(f)
  eig[: len(s)] = s**2 / K0.shape[0]
  kept = eig > max(tol, np.finfo(np.float64).eps * f) * eig[0]
  null = vt[~kept]
  return Projector(null.T @ null, int(kept.sum()), K0.shape[0])


def layer_projectors(
  hidden: np.ndarray, expert: np.ndarray, num_experts: int, tol: float
) -> list[Projector]:
  """One Projector per expert of a layer from its routed rows: hidden [R, f] (the
  down-projection inputs) and expert [R] (posttrain/expert_inputs.LayerInputs)."""
  return [null_space_projector(hidden[expert == e], tol) for e in range(num_experts)]


def check_capacity(gates: np.ndarray, projectors: list[Projector], block: int) -> None:
  """ConfigError when the T edit rows of a layer (gates [T, E]) need more room than
  the null spaces of the experts they route to hold: an exact edit of T rows needs
  T independent design rows, at most the summed free dimensions of those experts."""
  used = np.flatnonzero(np.any(gates > 0, axis=0))
  room = sum(projectors[e].free for e in used)
  if gates.shape[0] > room:
    detail = ", ".join(
      f"expert {e}: rank {projectors[e].rank} of {projectors[e].matrix.shape[0]}" for e in used[:4]
    )
    raise ConfigError(
      f"block {block}: {gates.shape[0]} edit rows need more room than the null spaces of "
      f"the {len(used)} experts they route to hold ({room} free dimensions in all; the "
      f"preserved keys have {detail}{', ...' if len(used) > 4 else ''}); edit fewer facts "
      "or raise the null-space tolerance"
    )
