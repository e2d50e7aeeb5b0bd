"""FedGEM: federated generalised EM with an unknown number of clusters (Ibrahim,
Gebraeel and Xie, ICLR 2026, arXiv 2601.21160), and two baselines.

Each round every client g runs an E and an M step on its own K_g-component
mixture, giving the maximisers xM_kg, and sends the balls B(xM_kg, eps_kg) with
eps_kg the largest radius on which its Q does not fall below Q at the old mean
(the GEM condition). The server joins balls of different clients that intersect
into global clusters (connected components, so K-hat is found, not given), puts
each cluster's shared mean inside the intersection of its balls and broadcasts.

No code was published; guesses (marked GUESS below): only the means are shared
(weights and variances stay local); clients also send N_kg = sum_n gamma_nkg so
the server can aim at the pooled M step; how the point inside the intersection
is chosen (shared_point); merges persist across rounds; two components of one
client never join (a cannot-link constraint: with no conflict the clusters are
exactly the connected components); client g's initial means are greedy
k-means++ with seed [seed, g]. The spec's vmap over clients is a Python loop
here (clients differ in n_g and K_g).

Seen when run: a cluster's previous shared mean lies on the boundary of every
member's next ball, so once it is inside the convex hull of the members'
maximisers the intersection is that single point and the mean stops moving (a
fixed point within the spread of the local estimates, not the pooled optimum).
server_step="pooled" (not the paper) takes the pooled M step instead, to measure
what that costs (docs/results/studies/fedgem/results.md).

Baselines: centralised EM on the pooled data with the true K, and one-shot k-FED
(Dennis, Li and Smith, ICML 2021): local k-means, then k-means of the local
centres on the server (GUESS: k-means++ seeding on the server instead of the
paper's farthest-point seeding).
"""

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError, choice_error
from moejax.mixtures import gmm as gmm_lib
from moejax.mixtures import kmeans
from moejax.mixtures.gmm import GMM

SERVER_STEPS = ("intersection", "pooled")


def q_ball_radius(
  old_means: jax.Array | np.ndarray,
  maximisers: jax.Array | np.ndarray,
  variances: jax.Array | np.ndarray,
) -> jax.Array:
  """[K] the largest eps with Q_k(mu) >= Q_k(mu_old) on B(xM_k, eps), at fixed variances.

  Q_k(mu) = c - sum_j (N_k / 2 sigma_kj^2)(mu_j - xM_kj)^2, so the set where Q_k does
  not fall is an ellipsoid through mu_old; isotropic: eps = ||mu_old - xM_k|| (the
  spec's derivation), diagonal: eps^2 = min_j sigma_kj^2 sum_j (delta_j / sigma_kj)^2."""
  delta = old_means - maximisers
  if variances.ndim == 1:
    return jnp.linalg.norm(delta, axis=-1)
  return jnp.sqrt(jnp.min(variances, axis=-1) * jnp.sum(delta**2 / variances, axis=-1))


@jax.jit
def local_em(x: jax.Array, local: GMM) -> tuple[GMM, jax.Array, jax.Array]:
  """A client's E and M step: (mixture with means xM, responsibilities, radii eps)."""
  resp, _ = gmm_lib.e_step(x, local)
  new = gmm_lib.m_step(x, resp, local)
  return new, resp, q_ball_radius(local.means, new.means, local.variances)


@jax.jit
def set_means(x: jax.Array, resp: jax.Array, local: GMM, means: jax.Array) -> GMM:
  """Take the broadcast means, then the variances that maximise Q at them (an ECM step,
  so Q rises whenever the means are inside the balls)."""
  variances = gmm_lib.component_variances(x, resp, means, diagonal=local.variances.ndim == 2)
  return local._replace(means=means, variances=variances)


def server_merge(centres, radii, owners, groups=None) -> np.ndarray:
  """[B] consecutive global-cluster labels of B balls: union-find over the pairs of
  balls of different owners (clients) that intersect, deepest overlap first.

  `groups` (labels from an earlier round) start already joined. GUESS: a union that
  would put two balls of one owner in a cluster is skipped (cannot-link)."""
  centres, radii, owners = np.asarray(centres), np.asarray(radii), np.asarray(owners)
  count = len(radii)
  groups = np.arange(count) if groups is None else np.asarray(groups)
  parent = np.array([int(np.flatnonzero(groups == g)[0]) for g in groups])
  held = {int(root): set(owners[groups == groups[root]].tolist()) for root in set(parent)}

  def find(i):
    while parent[i] != i:
      parent[i] = parent[parent[i]]
      i = parent[i]
    return i

  dist = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
  depth = radii[:, None] + radii[None] - dist
  pairs = [
    (i, j)
    for i in range(count)
    for j in range(i + 1, count)
    if owners[i] != owners[j] and depth[i, j] >= 0
  ]
  for i, j in sorted(pairs, key=lambda p: -depth[p]):
    a, b = find(i), find(j)
    if a != b and not held[a] & held[b]:
      parent[b] = a
      held[a] |= held.pop(b)
  roots = [find(i) for i in range(count)]
  first = {r: n for n, r in enumerate(dict.fromkeys(roots))}
  return np.array([first[r] for r in roots])


def shared_point(
  centres, radii, counts, anchor=None, *, sweeps: int = 500, tol: float = 1e-12
) -> np.ndarray:
  """[d] a point of the intersection of the balls, aimed at the pooled M step
  target = sum N_b xM_b / sum N_b. One ball: its centre.

  GUESS (the paper's choice is not known): with an `anchor` inside every ball (the
  cluster's previous shared mean, on every ball's boundary), the point furthest
  along the segment anchor -> target that stays inside all balls (closed form);
  without one (a cluster formed this round), the point of the intersection nearest
  the target by Dykstra's alternating projections (if the balls share no point,
  where the projections settle)."""
  centres, radii = np.asarray(centres, np.float64), np.asarray(radii, np.float64)
  if len(centres) == 1:
    return centres[0]
  counts = np.asarray(counts, np.float64)
  counts = counts if counts.sum() > 0 else np.ones_like(counts)
  target = counts @ centres / counts.sum()
  if anchor is not None:
    step, rel = target - anchor, anchor - centres  # |rel + t step|^2 <= r^2 for t in [0, t_b]
    a, b = step @ step, rel @ step
    c = np.minimum(np.sum(rel**2, axis=1) - radii**2, 0.0)  # the anchor is inside
    if a == 0:
      return anchor
    t_max = (-b + np.sqrt(np.maximum(b**2 - a * c, 0.0))) / a
    return anchor + np.clip(t_max.min(), 0.0, 1.0) * step
  point = target
  increments = np.zeros_like(centres)
  for _ in range(sweeps):
    before = point
    for k in range(len(centres)):
      moved = point + increments[k]
      offset = moved - centres[k]
      norm = np.linalg.norm(offset)
      point = centres[k] + offset * (min(1.0, radii[k] / norm) if norm > 0 else 1.0)
      increments[k] = moved - point
    if np.linalg.norm(point - before) <= tol * (1 + np.linalg.norm(point)):
      break
  return point


@dataclasses.dataclass
class FedGEMResult:
  """The global mixture (K-hat components), each local component's global cluster,
  each point's global cluster, the final local mixtures and the rounds run."""

  num_clusters: int
  global_model: GMM
  component_cluster: list[np.ndarray]
  labels: list[np.ndarray]
  local_models: list[GMM]
  rounds: int


def check_clients(clients: Sequence, local_ks: Sequence[int]) -> list[jax.Array]:
  """The clients' data as [n_g, d] arrays; refuse a mismatch, an empty client or a bad K_g."""
  if len(clients) != len(local_ks) or not clients:
    raise ConfigError(
      f"need one local K per client and at least one client "
      f"(clients={len(clients)}, local_ks={list(local_ks)})"
    )
  arrays = [jnp.asarray(x) for x in clients]
  for g, x in enumerate(arrays):
    if x.ndim != 2:
      raise ConfigError(f"client {g}: expected points as [n, d], got shape {x.shape}")
    if x.shape[0] == 0:
      raise ConfigError(f"client {g} holds no points (clients[{g}] has shape {x.shape})")
    if x.shape[1] != arrays[0].shape[1]:
      raise ConfigError(f"client {g} has dimension {x.shape[1]}, client 0 has {arrays[0].shape[1]}")
    try:
      gmm_lib.check_num_components(int(local_ks[g]), x.shape[0])
    except ConfigError as e:
      raise ConfigError(f"client {g}: {e}") from None
  return arrays


def fedgem(
  clients: Sequence,
  local_ks: Sequence[int],
  *,
  seed: int = 0,
  max_rounds: int = 200,
  tol: float = 1e-6,
  diagonal: bool = False,
  init: Sequence[GMM] | None = None,
  server_step: str = "intersection",
) -> FedGEMResult:
  """Rounds of local E/M steps, server merge and broadcast, until no merge happens and
  no mean moves by more than tol * (1 + max |mean|) (tol=0: exactly max_rounds rounds);
  the final aggregation pools each global cluster's weights (by N_kg) and variances.

  server_step "intersection" (the paper) puts each shared mean inside its balls;
  "pooled" (a diagnostic, not the paper) takes the pooled M step sum N xM / sum N."""
  if server_step not in SERVER_STEPS:
    raise choice_error("server_step", server_step, SERVER_STEPS)
  data = check_clients(clients, local_ks)
  if init is not None and len(init) != len(data):
    raise ConfigError(
      f"need one initial mixture per client (init={len(init)}, clients={len(data)})"
    )
  models = (
    list(init)
    if init is not None
    else [
      gmm_lib.init_gmm(x, int(k), seed=[seed, g], diagonal=diagonal)
      for g, (x, k) in enumerate(zip(data, local_ks))
    ]
  )
  owners = np.repeat(np.arange(len(data)), [int(k) for k in local_ks])
  splits = np.cumsum([int(k) for k in local_ks])[:-1]
  groups = np.arange(len(owners))
  rounds = 0
  for rounds in range(1, max_rounds + 1):
    steps = [local_em(x, m) for x, m in zip(data, models)]
    old = np.concatenate([np.asarray(m.means, np.float64) for m in models])
    centres = np.concatenate([np.asarray(s[0].means, np.float64) for s in steps])
    radii = np.concatenate([np.asarray(s[2], np.float64) for s in steps])
    counts = np.concatenate([np.asarray(jnp.sum(s[1], axis=0), np.float64) for s in steps])
    merged = server_merge(centres, radii, owners, groups)
    limits = np.full_like(radii, np.inf) if server_step == "pooled" else radii
    shared = np.stack(
      [
        shared_point(
          centres[merged == c], limits[merged == c], counts[merged == c], _common(old[merged == c])
        )
        for c in range(merged.max() + 1)
      ]
    )
    new_means = shared[merged]
    dtype = data[0].dtype
    models = [
      set_means(x, resp, new, jnp.asarray(means, dtype))
      for x, (new, resp, _), means in zip(data, steps, np.split(new_means, splits))
    ]
    joined = merged.max() < groups.max()
    groups = merged
    if not joined and np.max(np.abs(new_means - old)) <= tol * (1 + np.abs(old).max()):
      break
  return _aggregate(data, models, groups, splits, rounds)


def _common(means: np.ndarray):
  """The members' shared mean when they all hold the same one, else None."""
  return means[0] if np.all(means == means[0]) else None


def _aggregate(data, models, groups, splits, rounds) -> FedGEMResult:
  """Final aggregation: the global mixture and every point's global cluster."""
  num = int(groups.max()) + 1
  dim = data[0].shape[1]
  counts = np.concatenate(
    [np.asarray(m.weights, np.float64) * x.shape[0] for x, m in zip(data, models)]
  )
  means = np.concatenate([np.asarray(m.means, np.float64) for m in models])
  var = np.concatenate(
    [np.asarray(gmm_lib.per_dim_variances(m.variances, dim), np.float64) for m in models]
  )
  pooled = np.stack([np.bincount(groups, counts * var[:, j], num) for j in range(dim)], 1)
  total = np.maximum(np.bincount(groups, counts, num), np.finfo(np.float64).tiny)
  variances = pooled / total[:, None]
  first = np.array([np.flatnonzero(groups == c)[0] for c in range(num)])
  diagonal = models[0].variances.ndim == 2
  global_model = GMM(
    weights=total / total.sum(),
    means=means[first],
    variances=variances if diagonal else variances.mean(axis=1),
  )
  component_cluster = np.split(groups, splits)
  labels = [
    component_cluster[g][np.asarray(gmm_lib.predict(x, m))]
    for g, (x, m) in enumerate(zip(data, models))
  ]
  return FedGEMResult(
    num_clusters=num,
    global_model=global_model,
    component_cluster=component_cluster,
    labels=labels,
    local_models=models,
    rounds=rounds,
  )


def centralised_em(
  clients: Sequence,
  k: int,
  *,
  seed: int = 0,
  max_steps: int = 200,
  tol: float = 1e-6,
  diagonal: bool = False,
):
  """Baseline: EM with the true K on the pooled data; (mixture, labels per client)."""
  data = check_clients(clients, [1] * len(clients))
  pooled = jnp.concatenate(data)
  model, _ = gmm_lib.fit(pooled, k, seed=seed, max_steps=max_steps, tol=tol, diagonal=diagonal)
  labels = np.asarray(gmm_lib.predict(pooled, model))
  return model, np.split(labels, np.cumsum([x.shape[0] for x in data])[:-1])


def lloyd(x, k: int, *, seed, max_steps: int = 100) -> tuple[np.ndarray, np.ndarray]:
  """k-means (kmeans.lloyd) from k-means++ seeds: (centres [k, d], labels [n])."""
  x = np.asarray(x, np.float64)
  result = kmeans.lloyd(x, init_centroids=gmm_lib.kmeans_plus_plus(x, k, seed), max_iter=max_steps)
  return np.asarray(result.centroids, np.float64), np.asarray(result.labels)


def kfed(clients: Sequence, local_ks: Sequence[int], k: int, *, seed: int = 0):
  """One-shot k-FED (Dennis et al. 2021): client g runs k-means with K_g; the server
  runs k-means with K on all local centres; (centres [K, d], labels per client)."""
  data = check_clients(clients, local_ks)
  local = [lloyd(x, int(kg), seed=[seed, g]) for g, (x, kg) in enumerate(zip(data, local_ks))]
  stacked = np.concatenate([c for c, _ in local])
  try:
    gmm_lib.check_num_components(k, len(stacked))
  except ConfigError as e:
    raise ConfigError(f"k-FED server: {e} (n = local centres)") from None
  centres, server = lloyd(stacked, k, seed=[seed, len(data)])
  offsets = np.cumsum([0] + [int(kg) for kg in local_ks])
  return centres, [server[offsets[g] + labels] for g, (_, labels) in enumerate(local)]
