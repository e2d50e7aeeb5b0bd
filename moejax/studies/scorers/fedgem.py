"""FedGEM (Ibrahim, Gebraeel and Xie, arXiv 2601.21160): does federated generalised EM
find the number of clusters, and cluster as well as centralised EM and one-shot k-FED?

Level `separation`, draw t: one instance of `moejax.mixtures.synthetic.federated_clusters`
from numpy default_rng([seed, round(1000 separation), t]) (K isotropic unit Gaussians,
the closest means `separation` apart, each client holding min_held..max_held of them).
Arms (arm setting `method`, moejax/mixtures/fedgem.py, every method seeded seed + t):
  fedgem         FedGEM, the paper's server step (a point inside the balls' intersection)
  fedgem_pooled  FedGEM with the pooled M step at the server (a diagnostic, not the paper)
  central_em     EM on the pooled data with the true K
  kfed           one-shot k-FED with the true K (and each client's true K_g)
Metrics: ari (adjusted Rand index with the true clusters), and for the FedGEM arms
k_hat (the clusters found), k_hat_correct (1 if k_hat = K) and rounds.
Every comparison (claims, tables, the figure) is paired by draw: arm - reference on the
same instance (`paired_differences`), never two arms' separate intervals side by side.
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

METHODS = ("fedgem", "fedgem_pooled", "central_em", "kfed")
NOTES = """Every method starts from greedy k-means++ seeds, once (no restarts): centralised
EM fits K components to the pooled data at once and lands in worse local optima than the
clients' 3-4-component problems. k-FED and centralised EM are given the true K (and k-FED
each client's true K_g, as are FedGEM's clients); FedGEM finds K-hat. The fedgem_pooled
arm (not the paper) replaces the point inside the balls' intersection by the pooled M
step: the paper's step stops moving a shared mean once it is inside the hull of the
clients' maximisers (moejax/mixtures/fedgem.py), and this arm measures what that costs.
The guesses behind FedGEM are listed in moejax/mixtures/fedgem.py."""


@SCORERS.register("fedgem")
class FedGEMStudy(Scorer):
  settings = {
    "clusters": 8,
    "clients": 5,
    "min_held": 3,
    "max_held": 4,
    "dim": 2,
    "points": 100,
    "max_rounds": 200,
    "seed": 0,
  }
  arm_settings = {"method": "fedgem"}

  def metrics(self):
    return ("ari", "k_hat_correct", "k_hat", "rounds")

  def check(self):
    from moejax.mixtures import synthetic

    s = self.settings
    for key, value in s.items():
      minimum = 0 if key == "seed" else 1
      if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"study.settings.{key}={value!r} must be an integer >= {minimum}")
    try:
      synthetic.check_federation(s["clusters"], s["clients"], (s["min_held"], s["max_held"]))
    except ConfigError as e:
      raise ConfigError(f"study.settings: {e}") from None
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["method"] not in METHODS:
        raise ConfigError(
          f"study.arms[{i}].method={arm['method']!r} (arm {name!r}) must be "
          f"one of {', '.join(METHODS)}"
        )
    for i, level in enumerate(self.spec.levels):
      sep = level.get("separation")
      if (
        set(level) != {"separation"}
        or isinstance(sep, bool)
        or not isinstance(sep, (int, float))
        or not sep > 0
      ):
        raise ConfigError(f"study.levels[{i}]={level!r} must be {{'separation': a number > 0}}")

  def score(self, level, draw, arms):
    from moejax.evaluation.partitions import adjusted_rand_index
    from moejax.mixtures import fedgem, synthetic

    s, sep = self.settings, float(level["separation"])
    rng = np.random.default_rng([s["seed"], round(sep * 1000), draw])
    data, labels, local_ks = synthetic.federated_clusters(
      rng,
      sep,
      clusters=s["clusters"],
      clients=s["clients"],
      held=(s["min_held"], s["max_held"]),
      dim=s["dim"],
      points=s["points"],
    )
    truth, pairing, seed = np.concatenate(labels), digest(*data), s["seed"] + draw

    def ari(pred):
      return adjusted_rand_index(truth, np.concatenate(pred))

    out = {}
    for name, arm in arms.items():
      method = arm["method"]
      if method in ("fedgem", "fedgem_pooled"):
        step = "pooled" if method == "fedgem_pooled" else "intersection"
        fed = fedgem.fedgem(data, local_ks, seed=seed, max_rounds=s["max_rounds"], server_step=step)
        scores = {
          "ari": ari(fed.labels),
          "k_hat": fed.num_clusters,
          "rounds": fed.rounds,
          "k_hat_correct": float(fed.num_clusters == s["clusters"]),
        }
      elif method == "central_em":
        _, em_labels = fedgem.centralised_em(
          data, s["clusters"], seed=seed, max_steps=s["max_rounds"]
        )
        scores = {"ari": ari(em_labels)}
      else:
        _, kfed_labels = fedgem.kfed(data, local_ks, s["clusters"], seed=seed)
        scores = {"ari": ari(kfed_labels)}
      out[name] = {**scores, PAIRING: pairing}
    return out

  def paired_differences(self, results, metric: str = "ari") -> dict:
    """{(arm, separation): t-interval over draws of arm - reference on the same draws}
    for every arm other than the study's reference (report.paired checks the pairing)."""
    by_key, out = report.index_runs(results["runs"]), {}
    for level in self.spec.levels:
      for arm in self.spec.arm_names:
        if arm == self.spec.reference:
          continue
        _, a, r = report.paired(self.spec, by_key, arm, self.spec.reference, level, metric)
        if a:
          out[(arm, level["separation"])] = stats.paired_difference(a, r)
    return out

  def plot(self, results, path):
    """ARI of each arm minus the reference's, paired by draw (mean, 95% t-interval),
    against the separation; P(K-hat = K) with Wilson intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec, diffs = self.spec, self.paired_differences(results)
    by_key = report.index_runs(results["runs"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for a, arm in enumerate(spec.arm_names):
      cells = sorted((sep, i) for (name, sep), i in diffs.items() if name == arm)
      if cells:
        xs = [sep for sep, _ in cells]
        left.plot(
          xs, [i.mean for _, i in cells], "o-", color=f"C{a}", label=f"{arm} - {spec.reference}"
        )
        left.fill_between(
          xs,
          [i.mean if i.lo is None else i.lo for _, i in cells],
          [i.mean if i.hi is None else i.hi for _, i in cells],
          color=f"C{a}",
          alpha=0.2,
        )
      found = [
        (
          level["separation"],
          list(report.values(spec, by_key, arm, level, "k_hat_correct").values()),
        )
        for level in spec.levels
      ]
      found = [(sep, v) for sep, v in found if v]
      if found:
        cells = [(sep, stats.wilson(int(sum(v)), len(v))) for sep, v in found]
        right.errorbar(
          [sep for sep, _ in cells],
          [i.mean for _, i in cells],
          yerr=[[i.mean - i.lo for _, i in cells], [i.hi - i.mean for _, i in cells]],
          fmt="o-",
          color=f"C{a}",
          capsize=3,
          label=arm,
        )
    left.axhline(0, color="k", lw=0.8)
    left.set(
      xlabel="separation (cluster stds)",
      ylabel="ARI difference",
      title="ARI minus the reference's, paired by draw (95% t)",
    )
    right.set(
      xlabel="separation (cluster stds)", ylabel="P(K-hat = K)", title="FedGEM finds K (95% Wilson)"
    )
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.suptitle(f"{spec.name}: {spec.draws} draws")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

  def notes(self, results):
    diffs = self.paired_differences(results)
    rows = [
      [arm, f"{sep:g}", stats.format_interval(i, "{:+.4f}")]
      for (arm, sep), i in sorted(diffs.items(), key=lambda kv: (kv[0][0], kv[0][1]))
    ]
    lines = [
      NOTES,
      "",
      f"## ari: each arm minus {self.spec.reference}, paired by draw",
      "",
      stats.markdown_table(["arm", "separation", "mean ± std [95% t-interval]"], rows),
      "",
    ]
    for metric in ("k_hat", "rounds"):
      lines += [f"## {metric}", "", report.summary_table(self.spec, results["runs"], metric), ""]
    return "\n".join(lines)
