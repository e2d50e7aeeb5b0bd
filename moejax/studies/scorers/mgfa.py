"""Mixtures of geodesic factor analysers on spheres (MGFA, ICML 2026): MGFA against a
vMF mixture and a Euclidean GMM on anisotropic clusters and on data outside MGFA's
family, and the MGFA estimate's error against the sample size (root-n consistency).

Levels (n, d, major, data): S^{d-1}, n points per cluster; `data` 'bands'
(`moejax.mixtures.synthetic.sphere_bands`: MGFA's own family, `major` the tangent std
along the bands) or 'heavy_tailed' (`sphere_heavy_blobs`: isotropic Student-t tangent
clusters with settings.heavy_df degrees of freedom and scale `major`: outside the family).
Clustering arms (arm setting `method` 'mgfa' with `factors` = q, 'vmf', 'gmm_diag') run
where n = settings.points; draw t: 2n points per cluster from numpy
default_rng((seed, d, round(1000 major), t)) ('bands'; 'heavy_tailed' appends 2),
alternate points for training and held-out; each method keeps the best of `restarts`
fits (`moejax.mixtures.sphere_compare.fit_best`, seeds [seed, t, r]). Metrics: ari
(training points), test_loglik (held-out log-likelihood per point w.r.t. the surface
measure; the GMM restricted to the sphere), steps (EM steps of the kept fit).
An arm with `consistency` (an MGFA arm) also runs at every n of the 'bands' levels with
major = settings.consistency_major: on the same training points it fits the MLE by EM
started at the true parameters (the likelihood's maximum next to the truth, the root
that consistency is about) and reports error = the mean geodesic distance of its K fitted mean
directions to the true ones (best matching; `sphere_compare.mean_direction_error`),
log_error its log: the paper's root-n consistency is a slope of -1/2 in log n.
The 'frechet' arm (a reference rate, not MGFA) runs at those levels too: draw t takes
`frechet_samples` samples of n points of one band (spacing 0, a fresh frame each),
from default_rng((seed, d, n, round(1000 major), t, 1)); error = the mean geodesic
distance of the sample Frechet mean to the band's centre, log_error its log.
"""

from __future__ import annotations

import math

import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

METHODS = ("mgfa", "vmf", "gmm_diag", "frechet")
DATA = ("bands", "heavy_tailed")
AXES = ("n", "d", "major", "data")
INTEGERS = ("clusters", "points", "restarts", "max_steps", "frechet_samples", "seed")
ANGLES = ("minor", "spacing", "consistency_major")


@SCORERS.register("mgfa")
class MGFAStudy(Scorer):
  settings = {
    "minor": 0.05,
    "spacing": 0.4,
    "clusters": 3,
    "points": 200,
    "restarts": 3,
    "max_steps": 200,
    "consistency_major": 0.5,
    "frechet_samples": 20,
    "heavy_df": 3.0,
    "seed": 0,
  }
  arm_settings = {"method": "mgfa", "factors": 1, "consistency": False}

  def metrics(self):
    return ("ari", "test_loglik", "steps", "log_error", "error")

  def check(self):
    s = self.settings
    for key in INTEGERS:
      minimum = 0 if key == "seed" else 1
      if not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < minimum:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be an integer >= {minimum}")
    for key in ANGLES:
      if isinstance(s[key], bool) or not isinstance(s[key], (int, float)) or not 0 < s[key] < 3:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be an angle in (0, 3) rad")
    df = s["heavy_df"]
    if isinstance(df, bool) or not isinstance(df, (int, float)) or not 0 < df < math.inf:
      raise ConfigError(f"study.settings.heavy_df={df!r} must be a finite number > 0")
    for i, level in enumerate(self.spec.levels):
      n, d, major = (level.get(k) for k in ("n", "d", "major"))
      if set(level) != set(AXES):
        raise ConfigError(f"study.levels[{i}]={level!r} must have the axes {', '.join(AXES)}")
      if level["data"] not in DATA:
        raise ConfigError(
          f"study.levels[{i}].data={level['data']!r} must be one of {', '.join(DATA)}"
        )
      if not (isinstance(n, int) and n >= 2 and isinstance(d, int) and d >= 3):
        raise ConfigError(
          f"study.levels[{i}]={level!r}: n must be an integer >= 2 and d an integer >= 3"
        )
      if isinstance(major, bool) or not isinstance(major, (int, float)) or not 0 < major < 3:
        raise ConfigError(f"study.levels[{i}].major={major!r} must be an angle in (0, 3) rad")
    min_d = min(level["d"] for level in self.spec.levels)
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["method"] not in METHODS:
        raise ConfigError(
          f"study.arms[{i}].method={arm['method']!r} (arm {name!r}) must be "
          f"one of {', '.join(METHODS)}"
        )
      q = arm["factors"]
      if arm["method"] == "mgfa" and not (isinstance(q, int) and 0 <= q <= min_d - 2):
        raise ConfigError(
          f"study.arms[{i}].factors={q!r} (arm {name!r}) must be an integer "
          f"in [0, d-2 = {min_d - 2}] for every level's d"
        )
      if not isinstance(arm["consistency"], bool) or (
        arm["consistency"] and arm["method"] != "mgfa"
      ):
        raise ConfigError(
          f"study.arms[{i}].consistency={arm['consistency']!r} (arm "
          f"{name!r}) must be true or false, and true only for method 'mgfa'"
        )
    ns = {level["n"] for level in self.spec.levels}
    if any(a["method"] != "frechet" for _, a in self.spec.arms) and s["points"] not in ns:
      raise ConfigError(
        f"study.settings.points={s['points']} is no level's n "
        f"({sorted(ns)}): the clustering arms would never run"
      )
    majors = {level["major"] for level in self.spec.levels if level["data"] == "bands"}
    if any(a["method"] == "frechet" or a["consistency"] for _, a in self.spec.arms) and (
      s["consistency_major"] not in majors
    ):
      raise ConfigError(
        f"study.settings.consistency_major={s['consistency_major']} is no "
        f"'bands' level's major ({sorted(majors)}): the frechet and "
        "consistency arms would never run"
      )

  def consistency_level(self, level) -> bool:
    return level["data"] == "bands" and level["major"] == self.settings["consistency_major"]

  def applies(self, arm, level):
    arm = self.spec.arm(arm)
    if arm["method"] == "frechet":
      return self.consistency_level(level)
    return level["n"] == self.settings["points"] or (
      arm["consistency"] and self.consistency_level(level)
    )

  def score(self, level, draw, arms):
    models = {n: a for n, a in arms.items() if a["method"] != "frechet"}
    out = self._clustering(level, draw, models) if models else {}
    for name, arm in arms.items():
      if arm["method"] == "frechet":
        out[name] = self._frechet(level, draw)
    return out

  def data(self, level, draw):
    """(training points, held-out points, training labels, true means, band axis or None,
    the rng the held-out GMM likelihood goes on drawing from)."""
    from moejax.mixtures import synthetic

    s, n, d, major = self.settings, level["n"], level["d"], level["major"]
    if level["data"] == "bands":
      rng = np.random.default_rng((s["seed"], d, round(major * 1000), draw))
      both, labels, means, axis = synthetic.sphere_bands(
        rng,
        d,
        s["clusters"],
        2 * n,
        spacing=s["spacing"],
        major=major,
        minor=s["minor"],
        with_axis=True,
      )
    else:
      rng = np.random.default_rng((s["seed"], d, round(major * 1000), draw, 2))
      both, labels, means = synthetic.sphere_heavy_blobs(
        rng, d, s["clusters"], 2 * n, spacing=s["spacing"], scale=major, df=s["heavy_df"]
      )
      axis = None
    return both[0::2], both[1::2], labels[0::2], means, axis, rng, digest(both)

  def true_mgfa(self, x, means, axis, major, factors):
    """The bands' MGFA (q = `factors`): W_j = [major e3, 0...], sigma^2 = minor^2."""
    import jax.numpy as jnp
    from moejax.mixtures import sphere

    k, d = means.shape
    w = np.zeros((k, d, factors))
    if factors:
      w[:, :, 0] = np.sqrt(max(major**2 - self.settings["minor"] ** 2, 0.0)) * axis
    return sphere.MGFA(
      *(
        jnp.asarray(a, x.dtype)
        for a in (np.full(k, 1 / k), means, w, np.full(k, self.settings["minor"] ** 2))
      )
    )

  def _clustering(self, level, draw, arms):
    from moejax.evaluation.partitions import adjusted_rand_index
    from moejax.mixtures import gmm, sphere, sphere_compare

    s = self.settings
    x, x_test, labels, means, axis, rng, pairing = self.data(level, draw)
    seeds, out = [[s["seed"], draw, r] for r in range(s["restarts"])], {}
    for name, arm in arms.items():
      method, out[name] = arm["method"], {PAIRING: pairing}
      if level["n"] == s["points"]:
        steps, model = sphere_compare.fit_best(
          method, x, s["clusters"], seeds, factors=arm["factors"], max_steps=s["max_steps"]
        )
        predict = gmm.predict if method == "gmm_diag" else sphere.predict
        out[name].update(
          ari=adjusted_rand_index(labels, np.asarray(predict(x, model))),
          test_loglik=sphere_compare.held_out_log_likelihood(method, model, x_test, rng),
          steps=steps,
        )
      if arm["consistency"] and self.consistency_level(level):
        truth = self.true_mgfa(x, means, axis, level["major"], arm["factors"])
        _, mle = sphere_compare.fit_best(
          method, x, s["clusters"], [], factors=arm["factors"], max_steps=s["max_steps"], init=truth
        )
        error = sphere_compare.mean_direction_error(means, np.asarray(mle.means))
        out[name].update(error=error, log_error=math.log(error))
    return out

  def _frechet(self, level, draw):
    import jax.numpy as jnp
    from moejax.mixtures import sphere, synthetic

    s, n, d, major = self.settings, level["n"], level["d"], level["major"]
    rng = np.random.default_rng((s["seed"], d, n, round(major * 1000), draw, 1))
    errors = []
    for _ in range(s["frechet_samples"]):
      x, _, means = synthetic.sphere_bands(rng, d, 1, n, spacing=0.0, major=major, minor=s["minor"])
      mean = sphere.frechet_mean(x)
      errors.append(float(sphere.geodesic_distance(mean, jnp.asarray(means[0], mean.dtype))))
    return {"error": float(np.mean(errors)), "log_error": math.log(np.mean(errors))}

  def notes(self, results):
    lines = []
    for metric, title in (
      ("steps", "EM steps of the kept fit"),
      (
        "error",
        "mean geodesic error (rad) of the MLE's mean directions "
        "(consistency arms) and of one band's Frechet mean",
      ),
    ):
      lines += [
        f"## {metric}: {title}",
        "",
        report.summary_table(self.spec, results["runs"], metric),
        "",
      ]
    return "\n".join(lines)

  def plot(self, results, path):
    """ARI and held-out log-likelihood per clustering level (bars: mean, 95% t-interval),
    and the MLE's and the Frechet mean's errors against n on log-log axes with n^-1/2
    guides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key, spec = report.index_runs(results["runs"]), self.spec

    def value(arm, level, metric):
      return list(report.values(spec, by_key, arm, level, metric).values())

    arms = [a for a, arm in spec.arms if arm["method"] != "frechet"]
    levels = [lv for lv in spec.levels if lv["n"] == self.settings["points"]]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    width = 0.8 / max(len(arms), 1)
    for j, arm in enumerate(arms):
      xs = np.arange(len(levels)) + (j - (len(arms) - 1) / 2) * width
      for ax, metric in zip(axes[:2], ("ari", "test_loglik")):
        found = [value(arm, lv, metric) for lv in levels]
        mean = np.array([np.mean(f) if f else np.nan for f in found])
        half = np.array([stats.t_interval(f).hi - np.mean(f) if len(f) > 1 else 0.0 for f in found])
        ax.bar(xs, mean, width, color=f"C{j}", alpha=0.7, label=arm)
        ax.errorbar(xs, mean, yerr=half, fmt="none", ecolor="black", capsize=3)
    for ax, title in zip(axes[:2], ("ARI with the true clusters", "held-out log-lik per point")):
      ax.set_xticks(
        np.arange(len(levels)),
        [f"S^{lv['d'] - 1}\n{lv['data']} {lv['major']:g}" for lv in levels],
        fontsize=7,
      )
      ax.set_title(f"{title} (mean, 95% t-interval)")
    axes[0].legend(fontsize=8)
    rated = [a for a, arm in spec.arms if arm["method"] == "frechet" or arm["consistency"]]
    for j, arm in enumerate(rated):
      for c, d in enumerate(sorted({lv["d"] for lv in spec.levels})):
        mine = sorted(
          (lv for lv in spec.levels if lv["d"] == d and self.consistency_level(lv)),
          key=lambda lv: lv["n"],
        )
        found = [(lv["n"], value(arm, lv, "error")) for lv in mine if value(arm, lv, "error")]
        if not found:
          continue
        ns = np.array([n for n, _ in found], float)
        mean = np.array([np.mean(e) for _, e in found])
        axes[2].loglog(
          ns, mean, "o-" if j == 0 else "s--", color=f"C{c}", label=f"{arm}, S^{d - 1}"
        )
        axes[2].loglog(ns, mean[0] * (ns / ns[0]) ** -0.5, ":", color=f"C{c}", lw=0.8)
    axes[2].set(
      xlabel="n per cluster",
      ylabel="mean geodesic error (rad)",
      title="error of the mean directions (dotted: n^-1/2)",
    )
    axes[2].legend(fontsize=7)
    fig.suptitle(f"{spec.name}: {spec.draws} draws")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
