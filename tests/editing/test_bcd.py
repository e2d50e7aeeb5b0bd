"""MoEEdit's solve (moejax/editing/bcd.py, nullspace.py) against numpy oracles:
the null-space property, monotone block descent, the joint least-squares optimum
solved directly, and the uncoupled baseline's closed form."""

import numpy as np
import pytest

from moejax.editing import bcd, nullspace
from moejax.errors import ConfigError


def instance(seed=0, t=12, e=4, d=6, f=10, k=2, preserved=5):
  """Rows routed to k of e experts with softmax gates; keys; per-expert projectors
  from `preserved` random keys each."""
  rng = np.random.default_rng(seed)
  gates = np.zeros((t, e))
  for row in range(t):
    chosen = rng.choice(e, k, replace=False)
    w = np.exp(rng.normal(size=k))
    gates[row, chosen] = w / w.sum()
  keys = rng.normal(size=(t, e, f))
  R = rng.normal(size=(t, d))
  P = np.stack(
    [
      nullspace.null_space_projector(rng.normal(size=(preserved, f)), 1e-12).matrix
      for _ in range(e)
    ]
  )
  return R, gates, keys, P


def joint(R, gates, keys, P, lam):
  """The joint optimum by one linear solve: z_t = concat_j g_tj P_j k_tj."""
  v = np.einsum("jab,tjb->tja", P, keys) if P is not None else keys
  Z = (gates[..., None] * v).reshape(len(R), -1)
  full = -np.linalg.solve(Z.T @ Z + lam * np.eye(Z.shape[1]), Z.T @ R).T  # [d, E f]
  return full.reshape(R.shape[1], gates.shape[1], -1).transpose(1, 0, 2)


def test_edited_output_on_preserved_keys_is_unchanged():
  rng = np.random.default_rng(1)
  K0 = rng.normal(size=(7, 16)) * rng.uniform(0.1, 10, size=16)  # rank 7 of 16
  p = nullspace.null_space_projector(K0, 1e-12)
  assert (p.rank, p.free, p.num_keys) == (7, 9, 7)
  W, delta = rng.normal(size=(8, 16)), rng.normal(size=(8, 16)) * 10
  np.testing.assert_allclose((W + delta @ p.matrix) @ K0.T, W @ K0.T, atol=1e-5, rtol=0)
  assert np.max(np.abs((W + delta) @ K0.T - W @ K0.T)) > 1.0  # without P it moves
  np.testing.assert_allclose(p.matrix @ p.matrix, p.matrix, atol=1e-12)  # a projector


def test_the_tolerance_drops_small_directions_and_full_rank_leaves_no_room():
  rng = np.random.default_rng(2)
  basis = np.linalg.qr(rng.normal(size=(6, 6)))[0]
  q = np.linalg.qr(rng.normal(size=(200, 6)))[0]  # orthonormal columns: C's eigenbasis is `basis`
  K0 = q * np.array([1, 1, 1, 1, 1e-3, 1e-4]) @ basis.T
  assert nullspace.null_space_projector(K0, 1e-12).free == 0
  loose = nullspace.null_space_projector(K0, 1e-4)
  assert (loose.rank, loose.free) == (4, 2)
  np.testing.assert_allclose(loose.matrix, basis[:, 4:] @ basis[:, 4:].T, atol=1e-6)
  assert np.allclose(nullspace.null_space_projector(np.zeros((0, 6)), 0.1).matrix, np.eye(6))
  with pytest.raises(ConfigError, match="tolerance"):
    nullspace.null_space_projector(K0, 1.5)


def test_bcd_objective_never_increases_over_blocks():
  R, gates, keys, P = instance()
  _, history = bcd.bcd_edit(R, gates, keys, lam=0.1, projectors=P, passes=3, trace=True)
  steps = np.diff(history)
  assert len(history) == 1 + 3 * 4
  assert np.all(steps <= 1e-10 * history[0]), steps
  assert history[-1] < 0.9 * history[0]


@pytest.mark.parametrize("projected", [True, False])
def test_bcd_reaches_the_joint_least_squares_optimum(projected):
  R, gates, keys, P = instance(seed=3)
  P = P if projected else None
  lam = 0.05
  best = joint(R, gates, keys, P, lam)
  deltas = bcd.bcd_edit(R, gates, keys, lam=lam, projectors=P, passes=3000, seed=1)
  np.testing.assert_allclose(deltas, best, atol=1e-7)
  j_best = bcd.objective(R, gates, keys, best, lam, P)
  two = bcd.objective(R, gates, keys, bcd.bcd_edit(R, gates, keys, lam=lam, projectors=P), lam, P)
  zero = bcd.objective(R, gates, keys, np.zeros_like(best), lam, P)
  assert j_best <= two < zero
  if projected:  # the optimum's rows lie in the null space: Delta P = Delta
    np.testing.assert_allclose(np.einsum("jdf,jfg->jdg", best, P), best, atol=1e-10)


def test_decoupled_rows_reach_the_optimum_in_one_pass():
  R, gates, keys, P = instance(seed=4, k=1)
  best = joint(R, gates, keys, P, 0.2)
  np.testing.assert_allclose(
    bcd.bcd_edit(R, gates, keys, lam=0.2, projectors=P, passes=1), best, atol=1e-10
  )


def test_per_expert_lstsq_is_each_experts_weighted_ridge_solution():
  R, gates, keys, _ = instance(seed=5)
  lam = 0.3
  deltas = bcd.per_expert_lstsq(R, gates, keys, lam=lam)
  for j in range(gates.shape[1]):
    rows = gates[:, j] > 0
    g, k = gates[rows, j], keys[rows, j]
    # the gradient of sum_t g ||D k + R||^2 + lam ||D||^2 vanishes at the solution
    grad = 2 * ((deltas[j] @ k.T + R[rows].T) * g) @ k + 2 * lam * deltas[j]
    np.testing.assert_allclose(grad, 0, atol=1e-9)
  # one expert per row with gate 1: the same problem as unprojected BCD
  R, gates, keys, _ = instance(seed=6, k=1)
  gates = (gates > 0).astype(float)
  np.testing.assert_allclose(
    bcd.per_expert_lstsq(R, gates, keys, lam=lam),
    bcd.bcd_edit(R, gates, keys, lam=lam, passes=1),
    atol=1e-10,
  )


def test_capacity_check_names_the_rank():
  _, gates, _, _ = instance(t=30, e=2, k=1)
  full = [nullspace.null_space_projector(np.eye(10)[:9], 1e-12)] * 2  # 1 free dim each
  with pytest.raises(ConfigError, match=r"30 edit rows .*\(2 free dimensions .*rank 9 of 10"):
    nullspace.check_capacity(gates, full, block=1)
  nullspace.check_capacity(np.eye(2), full, block=1)  # one row per expert fits


def test_bad_inputs_are_refused():
  R, gates, keys, P = instance()
  with pytest.raises(ConfigError, match="lambda"):
    bcd.bcd_edit(R, gates, keys, lam=-1.0)
  with pytest.raises(ConfigError, match=r"\[T, d\]"):
    bcd.bcd_edit(R[:3], gates, keys, lam=1.0)
