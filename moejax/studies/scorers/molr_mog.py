"""MoLR-MoG (arXiv 2601.01475, ICLR 2026): how close to the true score the MoE-latent-MoG,
the MoE-latent-Gaussian and plain MLPs get, per noise level and against the number of
training points n (moejax/mixtures/molr_mog.py).

Arms are models (`model`: a name of molr_mog.MODELS, the arm's name by default); an arm
with `only_n` runs only at that n. Levels: `n` (training points, the first n of one
draw) x `sigma` (the noise level at which the score error is measured).

Draw d is replicate d of molr_mog.fit_and_score (instance d, its seeds): data from the
networks' family, or (settings.data_components set) from a richer MoLR-MoG with that
many full-covariance latent components (molr_mog.instance), outside it. A model is
trained once per (draw, n, arm), on the first request at that n, and its errors at every
sigma of the levels are cached for the other sigma levels. Metrics: `score_error`
(E|s_theta - s|^2 / E|s|^2), `log_l2_error` = ln sqrt(score_error) (the relative L2
error, whose slope against ln n the paper bounds by -1/2), `start_score_error` (before
training); at sigma = settings.report_sigma only (they do not depend on sigma):
`dsm_excess` (held-out DSM loss above the true score's), `max_angle_deg` (MoE models),
`params`, `final_train_loss`.
"""

from __future__ import annotations

import math

import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.mixtures import molr_mog, score_mixture
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

PER_MODEL = ("dsm_excess", "max_angle_deg", "params", "final_train_loss")
INTEGERS = ("dim", "subspaces", "latent_dim", "components", "steps", "batch_size", "eval_samples")
POSITIVE = ("mean_scale", "learning_rate", "sigma_min", "sigma_max", "report_sigma")


def _squared(cells):
  """(mean, low, high) of exp(2 x) for t-intervals of x = ln sqrt(score_error): the
  geometric mean of the score error over draws and its interval."""

  def value(c, v):
    return math.exp(2 * (c.mean if v is None else v))

  return (
    [value(c, c.mean) for c in cells],
    [value(c, c.lo) for c in cells],
    [value(c, c.hi) for c in cells],
  )


@SCORERS.register("molr_mog")
class MoLRMoG(Scorer):
  settings = {
    "dim": 64,
    "subspaces": 3,
    "latent_dim": 4,
    "components": 3,
    "mean_scale": 3.0,
    "steps": 3000,
    "batch_size": 256,
    "learning_rate": 1e-2,
    "sigma_min": 0.05,
    "sigma_max": 20.0,
    "eval_samples": 4096,
    "report_sigma": 1.0,
    "data_components": None,
  }
  arm_settings = {"model": None, "only_n": None}

  def __init__(self, spec):
    super().__init__(spec)
    self.data: tuple | None = None  # (draw, mixture, training points)
    self.fits: dict = {}  # (draw, n, arm) -> fit_and_score's dict, for the current (draw, n)

  def metrics(self):
    return ("score_error", "log_l2_error", "start_score_error", *PER_MODEL)

  def model(self, name: str) -> str:
    return self.spec.arm(name)["model"] or name

  def axis(self, name: str) -> list:
    return list(dict.fromkeys(level.get(name) for level in self.spec.levels))

  def check(self):
    s = self.settings
    for key in INTEGERS + POSITIVE:
      number = isinstance(s[key], (int, float)) and not isinstance(s[key], bool)
      if key in INTEGERS and not (isinstance(s[key], int) and number and s[key] >= 1):
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be an integer >= 1")
      if key in POSITIVE and not (number and math.isfinite(s[key]) and s[key] > 0):
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be a finite number > 0")
    rich = s["data_components"]
    if rich is not None and (isinstance(rich, bool) or not isinstance(rich, int) or rich < 1):
      raise ConfigError(
        f"study.settings.data_components={rich!r} must be null (the networks' "
        "family) or an integer >= 1"
      )
    try:
      score_mixture.check_sizes(s["dim"], s["subspaces"], s["latent_dim"], s["components"])
    except ConfigError as e:
      raise ConfigError(f"study.settings: {e}") from None
    if s["sigma_min"] > s["sigma_max"]:
      raise ConfigError(
        f"study.settings.sigma_min={s['sigma_min']} must be <= "
        f"study.settings.sigma_max={s['sigma_max']}"
      )
    for axis, ok, what in (
      ("n", lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
      ("sigma", lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    ):
      for i, level in enumerate(self.spec.levels):
        if isinstance(level.get(axis), bool) or not ok(level.get(axis)):
          raise ConfigError(f"study.levels[{i}].{axis}={level.get(axis)!r} must be {what}")
    if s["report_sigma"] not in self.axis("sigma"):
      raise ConfigError(
        f"study.settings.report_sigma={s['report_sigma']} must be one of the "
        f"levels' sigma {self.axis('sigma')}"
      )
    for i, (name, arm) in enumerate(self.spec.arms):
      if self.model(name) not in molr_mog.MODELS:
        raise ConfigError(
          f"study.arms[{i}].model={self.model(name)!r} (arm {name!r}) must "
          f"be one of {', '.join(molr_mog.MODELS)}"
        )
      if arm["only_n"] is not None and arm["only_n"] not in self.axis("n"):
        raise ConfigError(
          f"study.arms[{i}].only_n={arm['only_n']!r} (arm {name!r}) must be "
          f"one of the levels' n {self.axis('n')}"
        )

  def applies(self, arm, level):
    only = self.spec.arm(arm)["only_n"]
    return only is None or level["n"] == only

  def fit(self, name: str, draw: int, n: int) -> dict:
    s = self.settings
    if self.data is None or self.data[0] != draw:
      self.data = (
        draw,
        *molr_mog.instance(
          draw,
          s["dim"],
          s["subspaces"],
          s["latent_dim"],
          s["components"],
          mean_scale=s["mean_scale"],
          points=max(self.axis("n")),
          data_components=s["data_components"],
        ),
      )
    key = (draw, n, name)
    if key not in self.fits:
      self.fits = {k: v for k, v in self.fits.items() if k[:2] == (draw, n)}
      train = {
        k: s[k]
        for k in (
          "subspaces",
          "latent_dim",
          "components",
          "steps",
          "batch_size",
          "learning_rate",
          "sigma_min",
          "sigma_max",
          "eval_samples",
        )
      }
      self.fits[key] = molr_mog.fit_and_score(
        self.model(name), self.data[1], self.data[2][:n], draw, self.axis("sigma"), **train
      )
      self.fits[key][PAIRING] = digest(np.asarray(self.data[2][:n]))
    return self.fits[key]

  def score(self, level, draw, arms):
    out = {}
    for name in arms:
      fit, sigma = self.fit(name, draw, level["n"]), level["sigma"]
      error = fit["score_error"][sigma]
      out[name] = {
        "score_error": error,
        "log_l2_error": 0.5 * math.log(error),
        "start_score_error": fit["start_score_error"][sigma],
        PAIRING: fit[PAIRING],
      }
      if sigma == self.settings["report_sigma"]:
        out[name].update({k: fit[k] for k in PER_MODEL if k in fit})
    return out

  def cells(self, results, metric):
    """{(arm, n, sigma): t_interval over draws}."""
    by_key = report.index_runs(results["runs"])
    return {
      (arm, level["n"], level["sigma"]): stats.t_interval(list(found.values()))
      for arm in self.spec.arm_names
      for level in self.spec.levels
      if (found := report.values(self.spec, by_key, arm, level, metric))
    }

  def full_n(self) -> int:
    """The n at which the most arms run (the largest such)."""
    return max(
      self.axis("n"), key=lambda n: (sum(self.applies(a, {"n": n}) for a in self.spec.arm_names), n)
    )

  def notes(self, results):
    n, report_sigma = self.full_n(), self.settings["report_sigma"]
    error, sigmas = self.cells(results, "score_error"), self.axis("sigma")
    extra = {k: self.cells(results, k) for k in ("start_score_error", *PER_MODEL)}

    def fmt(c):
      return "—" if c is None else f"{c.mean:.2e} ± {(c.std or 0):.1e}"

    rows = []
    for arm in self.spec.arm_names:
      if (arm, n, report_sigma) not in error:
        continue

      def get(k, arm=arm):
        return extra[k].get((arm, n, report_sigma))

      rows.append(
        [
          arm,
          molr_mog.MODELS[self.model(arm)],
          f"{get('params').mean:.0f}" if get("params") else "—",
          *(fmt(error.get((arm, n, s))) for s in sigmas),
          fmt(get("start_score_error")),
          fmt(get("dsm_excess")),
          f"{get('max_angle_deg').mean:.2f} ± {get('max_angle_deg').std or 0:.2f}"
          if get("max_angle_deg")
          else "—",
        ]
      )
    table = stats.markdown_table(
      [
        "arm",
        "model",
        "params",
        *(f"sigma={s:g}" for s in sigmas),
        f"at start, sigma={report_sigma:g}",
        "held-out DSM excess",
        "max subspace angle (deg)",
      ],
      rows,
    )
    slopes = [
      [
        arm,
        *(
          stats.format_interval(i, "{:+.3f}") if i else "—"
          for i in (
            self.slope(results, arm, metric) for metric in ("score_error", "start_score_error")
          )
        ),
      ]
      for arm in self.spec.arm_names
    ]
    return (
      f"## Relative score error by noise level (n = {n})\n\nE|s_theta - s|^2 / E|s|^2, "
      f"mean ± std over draws; DSM excess and angles at the end of training.\n\n{table}"
      f"\n\n## Growth exponent in n (sigma = {report_sigma:g})\n\nPer draw, the "
      "least-squares slope of ln of the relative L2 error (ln sqrt(score_error)) on ln n, "
      "after training and at the start; mean ± std [95% t-interval] over draws.\n\n"
      + stats.markdown_table(
        ["arm", "slope", "slope at start"], [row for row in slopes if row[1] != "—"]
      )
    )

  def slope(self, results, arm, metric):
    """t-interval over draws of the slope of ln sqrt(metric) on ln n at report_sigma."""
    by_key = report.index_runs(results["runs"])
    levels = [
      level for level in self.spec.levels if level["sigma"] == self.settings["report_sigma"]
    ]
    found = [
      (level["n"], v)
      for level in levels
      if (v := report.values(self.spec, by_key, arm, level, metric))
    ]
    draws = sorted(set.intersection(*(set(v) for _, v in found))) if len(found) > 1 else []
    if not draws:
      return None
    x = [math.log(n) for n, _ in found]
    return stats.t_interval(
      [stats.slope(x, [0.5 * math.log(v[d]) for _, v in found]).mean for d in draws]
    )

  def plot(self, results, path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import ticker
    import matplotlib.pyplot as plt

    error, n = self.cells(results, "log_l2_error"), self.full_n()
    report_sigma = self.settings["report_sigma"]
    sigmas, ns = self.axis("sigma"), sorted(self.axis("n"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for a, arm in enumerate(self.spec.arm_names):
      for axis, keys, xs in (
        (left, [(arm, n, s) for s in sigmas], sigmas),
        (right, [(arm, m, report_sigma) for m in ns], ns),
      ):
        kept = [(x, error[k]) for x, k in zip(xs, keys) if k in error]
        if len(kept) > 1:
          mean, low, high = _squared([c for _, c in kept])
          axis.plot(
            [x for x, _ in kept], mean, "o-", color=f"C{a}", label=molr_mog.MODELS[self.model(arm)]
          )
          axis.fill_between([x for x, _ in kept], low, high, color=f"C{a}", alpha=0.2)
    first = [
      error[k] for k in error if self.model(k[0]) == "mog" and k[1:] == (ns[0], report_sigma)
    ]
    if first:  # a 1/n guide through the first MoE-latent-MoG point
      right.plot(
        ns, math.exp(2 * first[0].mean) * ns[0] / np.asarray(ns, float), "k:", label="slope -1"
      )
    for axis in (left, right):
      axis.set(xscale="log", yscale="log", ylabel="relative score error")
      axis.legend(fontsize=7)
    right.set_xticks(ns, [str(m) for m in ns], minor=False)
    right.xaxis.set_minor_formatter(ticker.NullFormatter())
    left.set(xlabel="noise level sigma", title=f"by noise level (n = {n})")
    right.set(xlabel="training points n", title=f"against n (sigma = {report_sigma:g})")
    fig.suptitle(
      f"MoLR-MoG: geometric mean of the relative score error over "
      f"{self.spec.draws} draws, 95% t-interval of its log"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
