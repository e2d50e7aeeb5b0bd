"""ACE, the Awakening Crowd of Experts (ICML 2026; abstract only): regret against the
horizon T of index policies when a new expert arrives every round (moejax/online/ace.py).

Arms are policies (`policy`: ucb, greedy, lcb, oracle; the arm's name by default) run
by a simulator (`simulator`: 'pruned', the exact numpy simulator that skips experts
which cannot be picked, or 'dense', the O(T^2) lax.scan model, run only at horizons <=
settings.dense_max_horizon). Levels: `variant` (ace.instance: iid uniform means on [0,
1], on [settings.interior_low, settings.interior_high], or an oblivious adversary's
staircase with decoys of mean settings.decoy) x `horizon`.

Draw d is row d of ace.instance(seed=settings.seed) and rewards from its own stream
(pruned: default_rng([seed + 1, T, d]); dense: fold_in(key(seed + 2), d)). All draws of
a (policy, simulator, level) are simulated in one vectorised batch on first request
and cached; draw d's regret does not depend on the other rows of the batch.

Metrics: `regret`, the pseudo-regret sum_t (max_{i<=t} mu_i - mu_{I_t}), and
`log_regret` = ln(regret) (absent where the regret is 0), whose slope against ln T
per draw is the growth exponent the claims test.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.online import ace
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

SIMULATORS = ("pruned", "dense")


@SCORERS.register("ace")
class ACE(Scorer):
  settings = {
    "c": 1.0,
    "block": 32,
    "decoy": 0.0,
    "seed": 0,
    "dense_max_horizon": 1000,
    "interior_low": 0.25,
    "interior_high": 0.75,
  }
  arm_settings = {"policy": None, "simulator": "pruned"}

  def __init__(self, spec):
    super().__init__(spec)
    self.cache: dict[tuple, tuple[np.ndarray, list[str]]] = {}

  def metrics(self):
    return ("regret", "log_regret")

  def policy(self, name: str) -> str:
    return self.spec.arm(name)["policy"] or name

  def check(self):
    s = self.settings
    for key, kwargs in (("c", {"c": s["c"]}), ("block", {"block": s["block"]})):
      try:
        ace.check(**kwargs)
      except ConfigError as e:
        raise ConfigError(f"study.settings.{key}: {e}") from None
    rules = {
      "decoy": (float, 0, 1, "a number in [0, 1]"),
      "seed": (int, 0, math.inf, "an integer >= 0"),
      "dense_max_horizon": (int, 0, math.inf, "an integer >= 0"),
    }
    for key, (kind, low, high, what) in rules.items():
      value = s[key]
      ok = isinstance(value, (int, float) if kind is float else int)
      if isinstance(value, bool) or not (ok and low <= value <= high):
        raise ConfigError(f"study.settings.{key}={value!r} must be {what}")
    low, high = s["interior_low"], s["interior_high"]
    if (
      not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
      or not 0 <= low < high <= 1
    ):
      raise ConfigError(
        f"study.settings.interior_low={low!r} and interior_high={high!r} must "
        "satisfy 0 <= interior_low < interior_high <= 1"
      )
    for i, (name, arm) in enumerate(self.spec.arms):
      if self.policy(name) not in ace.POLICIES:
        raise ConfigError(
          f"study.arms[{i}].policy={self.policy(name)!r} (arm {name!r}) must "
          f"be one of {', '.join(ace.POLICIES)}"
        )
      if arm["simulator"] not in SIMULATORS:
        raise ConfigError(
          f"study.arms[{i}].simulator={arm['simulator']!r} (arm {name!r}) "
          f"must be one of {', '.join(SIMULATORS)}"
        )
    for i, level in enumerate(self.spec.levels):
      if level.get("variant") not in ace.VARIANTS:
        raise ConfigError(
          f"study.levels[{i}].variant={level.get('variant')!r} must be one "
          f"of {', '.join(ace.VARIANTS)}"
        )
      horizon = level.get("horizon")
      if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ConfigError(f"study.levels[{i}].horizon={horizon!r} must be an integer >= 1")

  def applies(self, arm, level):
    return (
      self.spec.arm(arm)["simulator"] == "pruned"
      or level["horizon"] <= self.settings["dense_max_horizon"]
    )

  def batch(self, name: str, level: dict):
    """(regret [draws], pairing digests) of every draw of arm `name` at `level`."""
    s, arm = self.settings, self.spec.arm(name)
    key = (self.policy(name), arm["simulator"], level["variant"], level["horizon"])
    if key not in self.cache:
      draws = np.arange(self.spec.draws)
      means = ace.instance(
        level["variant"],
        level["horizon"],
        draws,
        seed=s["seed"],
        decoy=s["decoy"],
        interior=(s["interior_low"], s["interior_high"]),
      )
      if arm["simulator"] == "pruned":
        regret = ace.simulate(
          means, key[0], seed=s["seed"] + 1, c=s["c"], block=s["block"], rows=draws
        )[1]
      else:
        regret = ace.simulate_dense(
          jax.random.key(s["seed"] + 2), means, key[0], c=s["c"], rows=draws
        )[1]
      self.cache[key] = regret, [digest(row) for row in means]
    return self.cache[key]

  def score(self, level, draw, arms):
    out = {}
    for name in arms:
      regret, pairing = self.batch(name, level)
      value = float(regret[draw])
      out[name] = {"regret": value, PAIRING: pairing[draw]}
      if value > 0:
        out[name]["log_regret"] = math.log(value)
    return out

  def slopes(self, results: dict) -> dict:
    """{(variant, arm): t-interval of the per-draw slopes of ln regret on ln T}."""
    by_key, out = report.index_runs(results["runs"]), {}
    for variant in dict.fromkeys(level["variant"] for level in self.spec.levels):
      levels = [level for level in self.spec.levels if level["variant"] == variant]
      for arm in self.spec.arm_names:
        found = [report.values(self.spec, by_key, arm, level, "log_regret") for level in levels]
        kept = [(level, v) for level, v in zip(levels, found) if v]
        draws = sorted(set.intersection(*(set(v) for _, v in kept))) if len(kept) > 1 else []
        if draws:
          x = [math.log(level["horizon"]) for level, _ in kept]
          out[(variant, arm)] = stats.t_interval(
            [stats.slope(x, [v[d] for _, v in kept]).mean for d in draws]
          )
    return out

  def notes(self, results):
    rows = [
      [variant, arm, stats.format_interval(interval, "{:.3f}")]
      for (variant, arm), interval in self.slopes(results).items()
    ]
    return (
      "## Growth exponents\n\nPer draw, the least-squares slope of ln regret on ln T "
      "over the horizons the arm ran at; mean ± std [95% t-interval] over draws (the "
      "claims' statistic, for every arm).\n\n"
      + stats.markdown_table(["variant", "arm", "slope"], rows)
    )

  def plot(self, results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key, slopes = report.index_runs(results["runs"]), self.slopes(results)
    variants = list(dict.fromkeys(level["variant"] for level in self.spec.levels))
    fig, axes = plt.subplots(1, len(variants), figsize=(5.5 * len(variants), 4.2), squeeze=False)
    for ax, variant in zip(axes[0], variants):
      levels = [level for level in self.spec.levels if level["variant"] == variant]
      low = math.inf
      for a, arm in enumerate(self.spec.arm_names):
        cells = [
          (level["horizon"], stats.t_interval(list(found.values())))
          for level in levels
          if (found := report.values(self.spec, by_key, arm, level, "regret"))
        ]
        if len(cells) < 2:
          continue
        h = np.asarray([t for t, _ in cells], np.float64)
        mean = [i.mean for _, i in cells]
        low = min(low, *mean)
        slope = slopes.get((variant, arm))
        ax.plot(
          h, mean, "o-", color=f"C{a}", label=arm + (f" (slope {slope.mean:.2f})" if slope else "")
        )
        ax.fill_between(
          h,
          [i.mean if i.lo is None else max(i.lo, 1e-9) for _, i in cells],
          [i.mean if i.hi is None else i.hi for _, i in cells],
          color=f"C{a}",
          alpha=0.25,
        )
      h = np.asarray(sorted(level["horizon"] for level in levels), np.float64)
      if math.isfinite(low) and low > 0:
        for power, style in ((1.0, ":"), (2 / 3, "--")):
          ax.plot(h, low * (h / h[0]) ** power, "k" + style, lw=0.8, label=f"T^{power:.2g}")
      ax.set(xscale="log", yscale="log", xlabel="T", ylabel="regret", title=variant)
      ax.legend(fontsize=8)
    fig.suptitle(f"ACE: mean regret over {self.spec.draws} draws, 95% t-interval")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
