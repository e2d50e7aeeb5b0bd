"""MoEEdit's solve for one MoE layer (arXiv 2602.10965, the edit objective and
its randomised block coordinate descent; read against Terence-Gu/MoEEdit optim.py).

For edit rows t = 1..T (the subject's last token of each edit prompt), with
g_tj the combine weight of expert j at t (0 where j is not routed), k_tj its
key (down-projection input), v_tj = P_j k_tj and R_t = current layer output -
target output [d]:

  J(Delta) = sum_t || R_t + sum_j g_tj Delta_j v_tj ||^2 + lam sum_j ||Delta_j||_F^2

Block j's exact minimiser with the other blocks fixed:
  S_j = R + sum_{l != j} g_l Delta_l v_l,  B_j = S_j^T (g_j v_j),
  M_j = sum_t g_tj^2 v_tj v_tj^T + lam I,   Delta_j = -B_j M_j^{-1},
so J never increases from one block to the next, and its fixed point is the
joint least-squares optimum (J is strictly convex for lam > 0). `bcd_edit`
visits the experts the rows route to in a random order per pass (2 passes, as
the paper). The update of w_down[j] ([f, d]: y = h w_down) is (Delta_j P_j)^T.

`per_expert_lstsq` is the baseline without the coupling or the projection:
each routed expert alone moves its own output by -R_t,
min sum_t g_tj ||Delta_j k_tj + R_t||^2 + lam ||Delta_j||^2 (with gates that
sum to 1 the combined change is -R_t). Guess: the paper names the baseline,
not this weighting.
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError


def _checked(R, gates, keys, projectors, lam):
  R, gates, keys = (np.asarray(a, np.float64) for a in (R, gates, keys))
  t, d = R.shape
  if gates.ndim != 2 or gates.shape[0] != t or keys.shape[:2] != gates.shape:
    raise ConfigError(
      f"edit rows: R {R.shape}, gates {gates.shape} and keys {keys.shape} "
      "must be [T, d], [T, E] and [T, E, f]"
    )
  if not lam >= 0:
    raise ConfigError(f"lambda={lam} must be >= 0")
  f = keys.shape[2]
  if projectors is None:
    v = keys
  else:
    P = np.asarray(projectors, np.float64)
    if P.shape != (gates.shape[1], f, f):
      raise ConfigError(f"projectors {P.shape} must be [E, f, f] = {(gates.shape[1], f, f)}")
    v = np.einsum("jab,tjb->tja", P, keys)
  return R, gates, np.where(gates[..., None] > 0, v, 0.0)


def objective(R, gates, keys, deltas, lam: float, projectors=None) -> float:
  """J(Delta) of the module doc; deltas [E, d, f]."""
  R, gates, v = _checked(R, gates, keys, projectors, lam)
  out = R + np.einsum("tj,jdf,tjf->td", gates, np.asarray(deltas, np.float64), v)
  return float(np.sum(out**2) + lam * np.sum(np.asarray(deltas, np.float64) ** 2))


def bcd_edit(
  R,
  gates,
  keys,
  *,
  lam: float,
  projectors=None,
  passes: int = 2,
  seed: int = 0,
  trace: bool = False,
):
  """Deltas [E, d, f] float64 of randomised BCD on J (module doc); with `trace`
  also J after every block update (its first entry: J at Delta = 0).

  R [T, d]; gates [T, E] (0: not routed); keys [T, E, f]; projectors [E, f, f]
  or None (no projection, v = k). An expert no row routes to keeps Delta_j = 0;
  with lam = 0 a singular M_j is pseudo-inverted."""
  R, gates, v = _checked(R, gates, keys, projectors, lam)
  if passes < 1:
    raise ConfigError(f"passes={passes} must be >= 1")
  (t, d), (_, e, f) = R.shape, v.shape
  deltas = np.zeros((e, d, f))
  contrib = np.zeros((t, e, d))  # g_tj Delta_j v_tj
  total = R.copy()  # R + sum_j contrib
  used = np.flatnonzero(np.any(gates > 0, axis=0))
  history = [float(np.sum(total**2))]
  rng = np.random.default_rng(seed)
  for _ in range(passes):
    for j in rng.permutation(used):
      rows = gates[:, j] > 0
      g, vj = gates[rows, j], v[rows, j]
      s = total[rows] - contrib[rows, j]
      b = s.T @ (g[:, None] * vj)  # [d, f]
      m = vj.T @ ((g**2)[:, None] * vj) + lam * np.eye(f)  # [f, f]
      deltas[j] = (
        -np.linalg.lstsq(m.T, b.T, rcond=None)[0].T if lam == 0 else (-np.linalg.solve(m, b.T).T)
      )  # m symmetric
      new = np.zeros((t, d))
      new[rows] = g[:, None] * (vj @ deltas[j].T)
      total += new - contrib[:, j]
      contrib[:, j] = new
      if trace:
        history.append(float(np.sum(total**2) + lam * np.sum(deltas**2)))
  return (deltas, history) if trace else deltas


def per_expert_lstsq(R, gates, keys, *, lam: float) -> np.ndarray:
  """Deltas [E, d, f] of the uncoupled, unprojected baseline (module doc)."""
  R, gates, k = _checked(R, gates, keys, None, lam)
  e, f = gates.shape[1], k.shape[2]
  deltas = np.zeros((e, R.shape[1], f))
  for j in np.flatnonzero(np.any(gates > 0, axis=0)):
    rows = gates[:, j] > 0
    g, kj = gates[rows, j], k[rows, j]
    b = R[rows].T @ (g[:, None] * kj)
    m = kj.T @ (g[:, None] * kj) + lam * np.eye(f)
    deltas[j] = -np.linalg.lstsq(m, b.T, rcond=None)[0].T
  return deltas


def w_down_update(deltas: np.ndarray, projectors=None) -> np.ndarray:
  """The additive update of w_down [E, f, d]: (Delta_j P_j)^T per expert."""
  deltas = np.asarray(deltas, np.float64)
  if projectors is not None:
    deltas = np.einsum("jdf,jfg->jdg", deltas, np.asarray(projectors, np.float64))
  return np.transpose(deltas, (0, 2, 1))
