r"""FedGEM study (issue 16, method 2; moejax/mixtures/fedgem.py): does federated
generalised EM find the number of clusters, and cluster as well as centralised EM
(given the true K) and one-shot k-FED (given the true K)?

  python -m experiments.fedgem_study --json=docs/results/mixtures/fedgem.json \
      --markdown=docs/results/mixtures/fedgem.md --plot=docs/results/mixtures/fedgem.png

Each instance: K isotropic unit-variance Gaussians in `dim` dimensions whose means
are rescaled so that the closest two are `separation` apart; each client holds
`points` points of each of 3-4 of the clusters (every cluster held by at least
one client). Reported per separation over the instances: P(K-hat = K) with a
Wilson 95% interval, K-hat mean and std, and the adjusted Rand index (Hubert and
Arabie 1985) of every method, mean, std and a 95% interval of the mean.
"""
import json
import time

from absl import flags
import numpy as np

from moejax import cli
from moejax.errors import ConfigError

_SEPARATIONS = cli.checked(
    flags.DEFINE_list("separations", ["1", "1.5", "2", "2.5", "3", "4", "6"],
                      "Distances between the two closest means (units of the cluster std)."),
    cli.in_range(0, float("inf"), low_open=True))
_INSTANCES = cli.checked(flags.DEFINE_integer("instances", 50, "Instances per separation."),
                         cli.at_least(1))
_CLUSTERS = cli.checked(flags.DEFINE_integer("clusters", 8, "True number of clusters K."),
                        cli.at_least(1))
_CLIENTS = cli.checked(flags.DEFINE_integer("clients", 5, "Clients."), cli.at_least(1))
_MIN_HELD = cli.checked(flags.DEFINE_integer("min_held", 3, "Fewest clusters a client holds."),
                        cli.at_least(1))
_MAX_HELD = cli.checked(flags.DEFINE_integer("max_held", 4, "Most clusters a client holds."),
                        cli.at_least(1))
_DIM = cli.checked(flags.DEFINE_integer("dim", 2, "Data dimension."), cli.at_least(1))
_POINTS = cli.checked(flags.DEFINE_integer("points", 100, "Points per client per held "
                                           "cluster."), cli.at_least(1))
_ROUNDS = cli.checked(flags.DEFINE_integer("max_rounds", 200, "FedGEM rounds (and EM "
                                           "steps) at most."), cli.at_least(1))
_SEED = cli.checked(flags.DEFINE_integer("seed", 0, "Base seed."), cli.at_least(0))
_OUTPUTS = cli.study_outputs()

METHODS = ("fedgem", "fedgem_pooled", "central_em", "kfed")
NOTES = """Notes. Every method starts from greedy k-means++ seeds, once (no restarts):
centralised EM fits K = 8 components to the pooled data at once and lands in
worse local optima than the clients' 3-4-component problems. k-FED and
centralised EM are given the true K (and k-FED each client's true K_g, as are
FedGEM's clients); FedGEM finds K-hat. The pooled-step column (not the paper)
replaces the point inside the balls' intersection by the pooled M step: the
paper's step stops moving a shared mean once it is inside the hull of the
clients' maximisers (moejax/mixtures/fedgem.py), and this column measures what
that costs. `rounds` is the median number of FedGEM rounds (the cap is
--max_rounds). The guesses behind FedGEM are listed in moejax/mixtures/fedgem.py."""
NAMES = {"fedgem": "FedGEM", "fedgem_pooled": "FedGEM, pooled step (diagnostic)",
         "central_em": "centralised EM (true K)", "kfed": "k-FED (true K)"}


def make_instance(rng, separation, *, clusters, clients, held, dim, points):
  """(client data [n_g, d] float32, true labels, local K_g) for one instance."""
  means = rng.normal(size=(clusters, dim))
  if clusters > 1:
    gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)
    means *= separation / gaps[~np.eye(clusters, dtype=bool)].min()
  while True:  # draw the clusters each client holds until every cluster is held
    sets = [rng.choice(clusters, rng.integers(held[0], held[1] + 1), replace=False)
            for _ in range(clients)]
    if len(set(np.concatenate(sets).tolist())) == clusters:
      break
  labels = [np.repeat(np.sort(s), points) for s in sets]
  data = [(means[y] + rng.normal(size=(len(y), dim))).astype(np.float32) for y in labels]
  return data, labels, [len(s) for s in sets]


def run_instance(data, labels, local_ks, *, clusters, seed, max_rounds):
  from moejax.evaluation.partitions import adjusted_rand_index
  from moejax.mixtures import fedgem
  truth = np.concatenate(labels)
  ari = lambda pred: adjusted_rand_index(truth, np.concatenate(pred))  # noqa: E731
  fed = fedgem.fedgem(data, local_ks, seed=seed, max_rounds=max_rounds)
  pooled = fedgem.fedgem(data, local_ks, seed=seed, max_rounds=max_rounds,
                         server_step="pooled")
  _, em_labels = fedgem.centralised_em(data, clusters, seed=seed, max_steps=max_rounds)
  _, kfed_labels = fedgem.kfed(data, local_ks, clusters, seed=seed)
  return {"k_hat": fed.num_clusters, "k_hat_pooled": pooled.num_clusters,
          "rounds": fed.rounds, "ari": {"fedgem": ari(fed.labels),
                                        "fedgem_pooled": ari(pooled.labels),
                                        "central_em": ari(em_labels), "kfed": ari(kfed_labels)}}


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """Wilson score interval of a binomial proportion."""
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return float(centre - half), float(centre + half)


def summarise(records, clusters):
  hits = sum(r["k_hat"] == clusters for r in records)
  k_hat = np.array([r["k_hat"] for r in records], float)
  out = {"p_k_hat_correct": hits / len(records), "p_k_hat_ci95": wilson(hits, len(records)),
         "p_k_hat_correct_pooled": float(np.mean([r["k_hat_pooled"] == clusters
                                                  for r in records])),
         "k_hat_mean": float(k_hat.mean()), "k_hat_std": float(k_hat.std()),
         "rounds_median": float(np.median([r["rounds"] for r in records])), "ari": {}}
  for method in METHODS:
    values = np.array([r["ari"][method] for r in records])
    half = 1.96 * values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
    out["ari"][method] = {"mean": float(values.mean()), "std": float(values.std()),
                          "ci95": (float(values.mean() - half), float(values.mean() + half))}
  return out


def table(summary, settings) -> str:
  lines = [f"K = {settings['clusters']}, {settings['clients']} clients holding "
           f"{settings['min_held']}-{settings['max_held']} clusters each, "
           f"{settings['points']} points per held cluster, d = {settings['dim']}, "
           f"{settings['instances']} instances per separation; ARI mean ± std "
           f"[95% interval of the mean]; P with a Wilson 95% interval.", "",
           "| separation | P(K̂=K) FedGEM | K̂ mean ± std | "
           + " | ".join(f"ARI {NAMES[m]}" for m in METHODS) + " | P(K̂=K) pooled | rounds |",
           "|---" * (5 + len(METHODS)) + "|"]
  for sep, s in summary.items():
    lo, hi = s["p_k_hat_ci95"]
    aris = " | ".join(f"{a['mean']:.3f} ± {a['std']:.3f} [{a['ci95'][0]:.3f}, "
                      f"{a['ci95'][1]:.3f}]" for a in (s["ari"][m] for m in METHODS))
    lines.append(f"| {sep} | {s['p_k_hat_correct']:.2f} [{lo:.2f}, {hi:.2f}] | "
                 f"{s['k_hat_mean']:.2f} ± {s['k_hat_std']:.2f} | {aris} | "
                 f"{s['p_k_hat_correct_pooled']:.2f} | {s['rounds_median']:.0f} |")
  return "\n".join(lines)


def plot(summary, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  seps = [float(s) for s in summary]
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  p = [s["p_k_hat_correct"] for s in summary.values()]
  left.plot(seps, p, "o-", label="FedGEM")
  left.fill_between(seps, *zip(*[s["p_k_hat_ci95"] for s in summary.values()]), alpha=0.25)
  left.set(xlabel="separation (cluster std)", ylabel="P(K̂ = K)", ylim=(-0.02, 1.02),
           title="FedGEM finds K (Wilson 95%)")
  for method in METHODS:
    stats = [s["ari"][method] for s in summary.values()]
    right.plot(seps, [a["mean"] for a in stats], "o-", label=NAMES[method])
    right.fill_between(seps, *zip(*[a["ci95"] for a in stats]), alpha=0.2)
  right.set(xlabel="separation (cluster std)", ylabel="ARI", title="ARI (95% interval)")
  right.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  _OUTPUTS.check()
  if _MIN_HELD.value > _MAX_HELD.value or _MAX_HELD.value > _CLUSTERS.value:
    raise ConfigError(f"expected min_held <= max_held <= clusters (--min_held="
                      f"{_MIN_HELD.value}, --max_held={_MAX_HELD.value}, --clusters="
                      f"{_CLUSTERS.value})")
  if _CLIENTS.value * _MAX_HELD.value < _CLUSTERS.value:
    raise ConfigError(f"clients cannot hold every cluster: clients * max_held < clusters "
                      f"(--clients={_CLIENTS.value}, --max_held={_MAX_HELD.value})")
  settings = {"clusters": _CLUSTERS.value, "clients": _CLIENTS.value,
              "min_held": _MIN_HELD.value, "max_held": _MAX_HELD.value, "dim": _DIM.value,
              "points": _POINTS.value, "instances": _INSTANCES.value,
              "max_rounds": _ROUNDS.value, "seed": _SEED.value}
  start, records, summary = time.time(), {}, {}
  for index, sep in enumerate(_SEPARATIONS.value):
    records[sep] = []
    for i in range(_INSTANCES.value):
      rng = np.random.default_rng([_SEED.value, index, i])
      data, labels, local_ks = make_instance(
          rng, float(sep), clusters=_CLUSTERS.value, clients=_CLIENTS.value,
          held=(_MIN_HELD.value, _MAX_HELD.value), dim=_DIM.value, points=_POINTS.value)
      records[sep].append(run_instance(data, labels, local_ks, clusters=_CLUSTERS.value,
                                       seed=_SEED.value + i, max_rounds=_ROUNDS.value))
    summary[sep] = summarise(records[sep], _CLUSTERS.value)
    print(f"separation {sep}: {json.dumps(summary[sep])} ({time.time() - start:.0f}s)",
          flush=True)
  text = table(summary, settings)
  print(text)
  result = {"settings": settings, "runtime_s": round(time.time() - start, 1),
            "summary": summary, "instances": records}
  _OUTPUTS.write(result, f"# FedGEM study\n\n{text}\n\n{NOTES}\n\nRuntime "
                 f"{result['runtime_s']} s (python -m experiments.fedgem_study, defaults).",
                 lambda path: plot(summary, path))


if __name__ == "__main__":
  cli.run(main)
