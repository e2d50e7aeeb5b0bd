"""Coverage of 95% intervals for a mean (Student 1908): how often each interval built
from n normal samples contains the true mean.

Draw d samples n values from N(mu, sigma^2) with numpy default_rng((seed, d, n)).
Arms: 't' (moejax.evaluation.stats.t_interval), 'normal' (mean ± z s / sqrt(n), the
large-sample approximation), 'bootstrap' (stats.bootstrap_mean, percentile). The
metric `covers` is 1 if the interval holds mu. Closed forms: the t interval covers
with probability exactly 0.95; the normal one with P(|T_{n-1}| <= z_{0.975}) (0.878
at n = 5). A study of the statistics module itself, and the smallest example of a
study (configs/studies/interval_coverage.py).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.stats

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest


def normal_interval(values, confidence: float = 0.95) -> tuple[float, float]:
  values = np.asarray(values, np.float64)
  half = scipy.stats.norm.ppf(0.5 + confidence / 2) * values.std(ddof=1) / math.sqrt(values.size)
  return values.mean() - half, values.mean() + half


def normal_coverage(n: int, confidence: float = 0.95) -> float:
  """P(|T_{n-1}| <= z): the exact coverage of the normal-approximation interval."""
  z = scipy.stats.norm.ppf(0.5 + confidence / 2)
  return float(1 - 2 * scipy.stats.t.sf(z, n - 1))


@SCORERS.register("interval_coverage")
class IntervalCoverage(Scorer):
  settings = {"mu": 0.0, "sigma": 1.0, "seed": 0, "resamples": 500}
  arm_settings = {"interval": "t"}
  INTERVALS = ("t", "normal", "bootstrap")

  def metrics(self):
    return ("covers", "width")

  def check(self):
    if not self.settings["sigma"] > 0:
      raise ConfigError(f"study.settings.sigma={self.settings['sigma']} must be > 0")
    if not (isinstance(self.settings["resamples"], int) and self.settings["resamples"] >= 1):
      raise ConfigError(
        f"study.settings.resamples={self.settings['resamples']} must be an integer >= 1"
      )
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["interval"] not in self.INTERVALS:
        raise ConfigError(
          f"study.arms[{i}].interval={arm['interval']!r} (arm {name!r}) must "
          f"be one of {', '.join(self.INTERVALS)}"
        )
    for i, level in enumerate(self.spec.levels):
      if not (isinstance(level.get("n"), int) and level["n"] >= 2):
        raise ConfigError(f"study.levels[{i}].n={level.get('n')!r} must be an integer >= 2")

  def score(self, level, draw, arms):
    s = self.settings
    rng = np.random.default_rng((s["seed"], draw, level["n"]))
    sample = s["mu"] + s["sigma"] * rng.standard_normal(level["n"])
    out = {}
    for name, arm in arms.items():
      if arm["interval"] == "t":
        found = stats.t_interval(sample)
        lo, hi = found.lo, found.hi
      elif arm["interval"] == "normal":
        lo, hi = normal_interval(sample)
      else:
        found = stats.bootstrap_mean(sample, resamples=s["resamples"], seed=draw)
        lo, hi = found.lo, found.hi
      out[name] = {"covers": float(lo <= s["mu"] <= hi), "width": hi - lo, PAIRING: digest(sample)}
    return out

  def notes(self, results):
    levels = sorted({r["level"]["n"] for r in results["runs"]})
    return (
      "Closed-form coverage of the normal interval: "
      + ", ".join(f"n={n}: {normal_coverage(n):.3f}" for n in levels)
      + " (the t interval: 0.950)."
    )
