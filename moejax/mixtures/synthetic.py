"""Synthetic clustering problems with known clusters, one data set per numpy Generator.

two_clusters        two equal Gaussian clusters in R^d, means `separation` noise stds
                    apart along a random direction, and a random initial partition:
                    the high-dimensional regime of Lloyd vs Hartigan (arXiv 2602.09936)
federated_clusters  K isotropic Gaussians whose closest means are `separation` apart,
                    spread over clients that each hold a few of them (FedGEM, arXiv
                    2601.21160: 8 clusters, 5 clients holding 3-4 each)
sphere_bands        K parallel bands on S^{d-1}: anisotropic clusters from MGFA's own
                    family with q = 1 (mixtures of geodesic factor analysers, ICML 2026)
sphere_heavy_blobs  K isotropic heavy-tailed clusters on S^{d-1} (Student-t tangent
                    vectors): data outside MGFA's family, where an isotropic model is
                    the better guess

Each takes the Generator it draws from, so a caller seeds one data set per draw.
"""

import numpy as np

from moejax.errors import ConfigError


def two_clusters(rng: np.random.Generator, n: int, d: int, separation: float):
  """(X [n, d] float32, truth [n] int32, init [n] int32).

  truth: the first n // 2 points in cluster 0, the rest in 1; x = mu_y + N(0, I_d) with
  the means +-separation/2 along a uniformly random unit vector; init: uniform labels,
  redrawn until both clusters are non-empty."""
  if n < 2 or d < 1 or separation < 0:
    raise ConfigError(
      f"two_clusters needs n >= 2, d >= 1, separation >= 0 (n={n}, d={d}, separation={separation})"
    )
  truth = (np.arange(n) >= n // 2).astype(np.int32)
  u = rng.standard_normal(d)
  means = (truth[:, None] - 0.5) * separation * u / np.linalg.norm(u)
  X = rng.standard_normal((n, d)) + means
  init = rng.integers(0, 2, n).astype(np.int32)
  while len(set(init.tolist())) < 2:
    init = rng.integers(0, 2, n).astype(np.int32)
  return X.astype(np.float32), truth, init


def check_federation(clusters: int, clients: int, held: tuple[int, int]) -> None:
  """ConfigError unless 1 <= held[0] <= held[1] <= clusters and the clients can hold
  every cluster (clients * held[1] >= clusters)."""
  if not 1 <= held[0] <= held[1] <= clusters:
    raise ConfigError(
      f"need 1 <= min_held <= max_held <= clusters (min_held={held[0]}, "
      f"max_held={held[1]}, clusters={clusters})"
    )
  if clients * held[1] < clusters:
    raise ConfigError(
      f"clients cannot hold every cluster: clients * max_held < clusters "
      f"(clients={clients}, max_held={held[1]}, clusters={clusters})"
    )


def federated_clusters(
  rng: np.random.Generator,
  separation: float,
  *,
  clusters: int,
  clients: int,
  held: tuple[int, int],
  dim: int,
  points: int,
):
  """(client data [n_g, dim] float32, true labels [n_g], local K_g) for one instance.

  Means ~ N(0, I_dim), rescaled so that the closest two are `separation` apart; client
  g holds `points` points of each of held[0]..held[1] distinct clusters (drawn until
  every cluster is held by some client); unit-variance isotropic noise."""
  check_federation(clusters, clients, held)
  means = rng.normal(size=(clusters, dim))
  if clusters > 1:
    gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)
    means *= separation / gaps[~np.eye(clusters, dtype=bool)].min()
  while True:
    sets = [
      rng.choice(clusters, rng.integers(held[0], held[1] + 1), replace=False)
      for _ in range(clients)
    ]
    if len(set(np.concatenate(sets).tolist())) == clusters:
      break
  labels = [np.repeat(np.sort(s), points) for s in sets]
  data = [(means[y] + rng.normal(size=(len(y), dim))).astype(np.float32) for y in labels]
  return data, labels, [len(s) for s in sets]


def _sphere_frame(rng: np.random.Generator, d: int, k: int, spacing: float, name: str):
  """(e1, e2, e3) a random orthonormal frame, means [k, d] on the great circle through
  e1 and e2, `spacing` rad apart."""
  if d < 3:
    raise ConfigError(f"{name} needs d >= 3 for a direction off the means' circle (d={d})")
  e1, e2, e3 = np.linalg.qr(rng.standard_normal((d, d)))[0].T[:3]
  angles = (np.arange(k) - (k - 1) / 2) * spacing
  return (e1, e2, e3), np.cos(angles)[:, None] * e1 + np.sin(angles)[:, None] * e2


def _on_sphere(mu, v):
  from moejax.mixtures import sphere

  x = np.asarray(sphere.exp_map(mu, v), np.float64)
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def sphere_bands(
  rng: np.random.Generator,
  d: int,
  k: int,
  n: int,
  *,
  spacing: float,
  major: float,
  minor: float,
  with_axis: bool = False,
):
  """(x [k n, d] float32 unit vectors, labels [k n], means [k, d]), and the bands'
  common tangent axis e3 [d] when `with_axis`.

  In a random orthonormal frame e1, e2, e3 of R^d, the k mean directions lie on the
  great circle through e1 and e2, `spacing` rad apart; band j is Exp_mu_j(v) with v
  Gaussian in the tangent space at mu_j, std `major` along e3 (tangent at every mu_j)
  and `minor` along the other d - 2 tangent directions: MGFA's component with q = 1,
  W_j = major e3 (up to the sign and the split of the variance) and sigma^2 = minor^2."""
  (_, _, e3), means = _sphere_frame(rng, d, k, spacing, "sphere_bands")
  labels = np.repeat(np.arange(k), n)
  mu, g = means[labels], rng.standard_normal((k * n, d))
  v = minor * (g - np.sum(g * mu, 1, keepdims=True) * mu) + (major - minor) * np.outer(g @ e3, e3)
  out = (_on_sphere(mu, v), labels, means)
  return (*out, e3) if with_axis else out


def sphere_heavy_blobs(
  rng: np.random.Generator, d: int, k: int, n: int, *, spacing: float, scale: float, df: float
):
  """(x [k n, d] float32 unit vectors, labels [k n], means [k, d]): k isotropic clusters
  outside MGFA's family. Means as in sphere_bands; cluster j is Exp_mu_j(v) with v a
  multivariate Student-t in the tangent space at mu_j: scale * g / sqrt(chi2_df / df),
  g standard normal in the d - 1 tangent directions (heavy tails, no preferred axis)."""
  if not (scale > 0 and df > 0):
    raise ConfigError(f"sphere_heavy_blobs needs scale > 0 and df > 0 (scale={scale}, df={df})")
  _, means = _sphere_frame(rng, d, k, spacing, "sphere_heavy_blobs")
  labels = np.repeat(np.arange(k), n)
  mu, g = means[labels], rng.standard_normal((k * n, d))
  g = g - np.sum(g * mu, 1, keepdims=True) * mu
  v = scale * g / np.sqrt(rng.chisquare(df, (k * n, 1)) / df)
  return _on_sphere(mu, v), labels, means
