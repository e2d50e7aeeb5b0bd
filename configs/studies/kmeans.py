r"""Lloyd vs Hartigan k-means in high dimensions (Lederman et al., arXiv 2602.09936;
scorer moejax/studies/scorers/kmeans.py).

  python -m experiments.study --config=configs/studies/kmeans.py

The paper proves that in high-dimensional, high-noise settings essentially every
partition is a fixed point of Lloyd's algorithm, so it returns its initial partition,
and that Hartigan's algorithm does not fail this way. Our spec's test (n=40, d=2000,
two clusters: Lloyd returns its initial partition in >= 90% of trials, Hartigan's NMI
>= 0.8; at d=2 both succeed) supplies the thresholds.
"""

import ml_collections

from moejax.studies.spec import grid

DIMS = [2, 10, 50, 200, 1000, 2000]


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "kmeans"
  c.description = (
    "Setting (ours; the paper's is not known beyond its abstract): n = 40 points in two "
    "equal clusters, x = mu_y + N(0, I_d), the two means `separation` noise stds apart "
    "along a random direction, so the noise norm grows like sqrt(d) while the signal "
    "stays fixed. Each draw is fresh data and a uniformly random initial partition "
    "(both clusters non-empty), shared by every arm: Lloyd, Hartigan (single-point "
    "moves, a random visit order swept until a sweep moves nothing) and the initial "
    "partition itself. `returns_initial` is 1 when an algorithm ends at its initial "
    "partition (Wilson intervals); `nmi` is the NMI with the true clusters (bootstrap "
    "intervals of the mean). Lederman et al.: at high d Lloyd returns its initial "
    "partition while Hartigan recovers the clusters; at low d both succeed."
  )
  c.scorer = "kmeans"
  c.settings = {"n": 40, "max_iter": 100, "seed": 0}
  c.arms = [
    {"name": "lloyd", "algorithm": "lloyd"},
    {"name": "hartigan", "algorithm": "hartigan"},
    {"name": "initial", "algorithm": "initial"},
  ]
  c.levels = grid(("d", DIMS), ("separation", [6.0, 10.0, 14.0]))
  c.draws = 100
  c.reference = "lloyd"
  high, low = {"d": DIMS[-1]}, {"d": DIMS[0]}
  c.claims = [
    {
      "arm": "lloyd",
      "metric": "returns_initial",
      "interval": "wilson",
      "null": 0.9,
      "expect": "higher",
      "at": high,
      "source": "spec",
      "text": "at d=2000 Lloyd returns its initial partition in >= 90% of draws",
    },
    {
      "arm": "hartigan",
      "reference": "lloyd",
      "metric": "returns_initial",
      "expect": "lower",
      "at": high,
      "text": "Hartigan returns its initial partition less often than Lloyd",
    },
    {
      "arm": "hartigan",
      "metric": "nmi",
      "interval": "bootstrap",
      "null": 0.8,
      "expect": "higher",
      "at": high,
      "source": "spec",
      "text": "at d=2000 Hartigan recovers the clusters (NMI >= 0.8)",
    },
    {
      "arm": "lloyd",
      "metric": "nmi",
      "interval": "bootstrap",
      "null": 0.95,
      "expect": "higher",
      "at": low,
      "source": "spec",
      "text": "at d=2 Lloyd recovers the clusters (NMI > 0.95)",
    },
    {
      "arm": "hartigan",
      "metric": "nmi",
      "interval": "bootstrap",
      "null": 0.95,
      "expect": "higher",
      "at": low,
      "source": "spec",
      "text": "at d=2 Hartigan recovers the clusters (NMI > 0.95)",
    },
  ]
  return c
