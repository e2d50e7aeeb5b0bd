"""TMoW, the Test-time Mixture of World Models (Jang et al., ICLR 2026; arXiv 2601.22647):
next-state error on unseen linear-dynamics domains (moejax/online/tmow.py).

Arms are methods of tmow.METHODS (`method`, the arm's name by default); an arm with a
`tau` is the refined mixture at that router temperature (the temperature sweep), run
only at K = settings.headline_shots. `only_shots` restricts any arm to one K.
Levels: `shots`, the K transitions seen from each unseen domain.

Draw d is one replicate, tmow.unseen_domain_errors with numpy default_rng((seed, d)):
its training domains, then settings.unseen unseen domains, each seen at every K of the
levels in order from that one stream. A draw's values for every level and arm are
computed on its first request and cached (the stream runs through all K). Metrics:
`excess_mse` (next-state MSE over the noise floor, minus 1, averaged over the unseen
domains) and, for tmow_routed, tmow.DIAGNOSTICS.
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.online import tmow
from moejax.studies import report
from moejax.studies.scoring import SCORERS, Scorer

ROUTED = "tmow_routed"


@SCORERS.register("tmow")
class TMoW(Scorer):
  settings = {
    "seed": 0,
    "dim": 6,
    "domains": 4,
    "train": 500,
    "unseen": 10,
    "noise_std": 0.2,
    "radius": 0.9,
    "concentration": 1.0,
    "tau": 0.3,
    "strength": 4.0,
    "headline_shots": 8,
  }
  arm_settings = {"method": None, "tau": None, "only_shots": None}

  def __init__(self, spec):
    super().__init__(spec)
    self.cache: tuple[int, dict] | None = None

  def metrics(self):
    return ("excess_mse", *tmow.DIAGNOSTICS)

  def method(self, name: str) -> str:
    return self.spec.arm(name)["method"] or name

  def key(self, name: str) -> str:
    tau = self.spec.arm(name)["tau"]
    return self.method(name) if tau is None else f"tau={tau:g}"

  @property
  def shots(self) -> list:
    return [level.get("shots") for level in self.spec.levels]

  def check(self):
    s = {k: v for k, v in self.settings.items() if k not in ("seed", "headline_shots")}
    try:
      tmow.check_settings(**s)
    except ConfigError as e:
      raise ConfigError(f"study.settings.{e}") from None
    if isinstance(self.settings["seed"], bool) or not isinstance(self.settings["seed"], int):
      raise ConfigError(f"study.settings.seed={self.settings['seed']!r} must be an integer")
    for i, k in enumerate(self.shots):
      if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"study.levels[{i}].shots={k!r} must be an integer >= 1")
    if self.settings["headline_shots"] not in self.shots:
      raise ConfigError(
        f"study.settings.headline_shots={self.settings['headline_shots']!r} "
        f"must be one of the levels' shots {self.shots}"
      )
    for i, (name, arm) in enumerate(self.spec.arms):
      where = f"study.arms[{i}]"
      if self.method(name) not in tmow.METHODS:
        raise ConfigError(
          f"{where}.method={self.method(name)!r} (arm {name!r}) must be one "
          f"of {', '.join(tmow.METHODS)}"
        )
      if arm["tau"] is not None:
        if self.method(name) != "refined":
          raise ConfigError(f"{where}.tau (arm {name!r}) is for method 'refined' only")
        try:
          tmow.check_settings(**{**s, "tau": arm["tau"]})
        except ConfigError as e:
          raise ConfigError(f"{where}.{e} (arm {name!r})") from None
      if arm["only_shots"] is not None and arm["only_shots"] not in self.shots:
        raise ConfigError(
          f"{where}.only_shots={arm['only_shots']!r} (arm {name!r}) must be "
          f"one of the levels' shots {self.shots}"
        )

  def applies(self, arm, level):
    only = self.spec.arm(arm)["only_shots"]
    if only is None and self.spec.arm(arm)["tau"] is not None:
      only = self.settings["headline_shots"]
    return only is None or level["shots"] == only

  def replicate(self, draw: int) -> dict:
    if self.cache is None or self.cache[0] != draw:
      s = {k: v for k, v in self.settings.items() if k not in ("seed", "headline_shots")}
      taus = sorted({a["tau"] for _, a in self.spec.arms if a["tau"] is not None})
      rng = np.random.default_rng((self.settings["seed"], draw))
      self.cache = draw, tmow.unseen_domain_errors(rng, self.shots, taus, **s)
    return self.cache[1]

  def score(self, level, draw, arms):
    errors, k = self.replicate(draw), level["shots"]
    out = {}
    for name in arms:
      out[name] = {"excess_mse": errors[(self.key(name), k)]}
      if self.method(name) == ROUTED:
        out[name].update({m: errors[(m, k)] for m in tmow.DIAGNOSTICS})
    return out

  def means(self, results: dict, metric: str = "excess_mse") -> dict:
    """{(arm, K): t_interval over draws}."""
    by_key = report.index_runs(results["runs"])
    return {
      (arm, level["shots"]): stats.t_interval(list(found.values()))
      for arm in self.spec.arm_names
      for level in self.spec.levels
      if (found := report.values(self.spec, by_key, arm, level, metric))
    }

  def notes(self, results):
    m, k = self.means(results), self.settings["headline_shots"]
    last = max(self.shots)

    def mean(arm, s=k):
      return m[(arm, s)].mean if (arm, s) in m else float("nan")

    def than(a, b, s=k):
      return "below" if mean(a, s) < mean(b, s) else "not below"

    taus = [(a["tau"], name) for name, a in self.spec.arms if a["tau"] is not None]
    good = [f"{t:g}" for t, name in sorted(taus) if mean(name) < mean("global")]
    lines = [
      "## Notes",
      "",
      stats.markdown_table(
        ["method", "setting", "what"],
        [
          [n, *tmow.METHODS[self.method(n)]]
          for n in self.spec.arm_names
          if self.spec.arm(n)["tau"] is None
        ],
      ),
      "",
      f"- Temperature: the refined mixture is below the global model for tau in {good} "
      f"of the sweep (K={k}); tau -> 0 is the fixed top-1 router, a large tau tends to "
      "the uniform mixture.",
      f"- Refinement is biased: softmax(cos / tau) is not the mixture alpha, so the "
      f"refined error at K={last} ({mean('refined', last):.3f}) stays above the "
      f"true-alpha mixture of the same experts ({mean('oracle_alpha', last):.3f}); a fit "
      f"from scratch ({mean('scratch', last):.3f}) is {than('scratch', 'refined', last)} "
      "it there.",
      f"- The new prototype is the mean of K rank-one features, so it is noisy: routed "
      f"by K fresh transitions, the new expert is top-1 for "
      f"{self._diag(results, 'top1_is_new', k):.0%} of "
      f"unseen domains at K={k} ({self._diag(results, 'top1_is_new', last):.0%} at "
      f"K={last}). TMoW routed is {than(ROUTED, 'distilled')} the distilled expert alone "
      f"at K={k}: its mixture keeps the old experts.",
      f"- Teacher: the expert distilled from the fixed top-1 expert is "
      f"{than('distilled_fixed', 'scratch')} a fit from scratch at K={k}. The few-shot "
      "methods share the ridge strength; tau and the strength were set on a pilot run "
      "of 8 other seeds, so the margins are optimistic for TMoW.",
      "- Not the paper's setting: linear experts, features vec(x' x^T) (the state alone "
      "cannot tell the domains apart: every domain has the same state law), one routing "
      "level (the paper routes every GCN layer), all guesses in moejax/online/tmow.py.",
    ]
    return "\n".join(lines)

  def _diag(self, results, metric, k) -> float:
    found = self.means(results, metric)
    return found[(ROUTED, k)].mean if (ROUTED, k) in found else float("nan")

  def plot(self, results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, k, shots = self.means(results), self.settings["headline_shots"], sorted(self.shots)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))

    def band(cells):
      return (
        [c.mean if c.lo is None else c.lo for c in cells],
        [c.mean if c.hi is None else c.hi for c in cells],
      )

    for c, name in enumerate(n for n in self.spec.arm_names if self.spec.arm(n)["tau"] is None):
      xs = [s for s in shots if (name, s) in m]
      if not xs:
        continue
      setting = tmow.METHODS[self.method(name)][0]
      style = "--" if setting == "zero-shot" else ":" if setting == "reference" else "-"
      left.plot(
        xs,
        [m[(name, s)].mean for s in xs],
        style + "o",
        color=f"C{c % 10}",
        ms=3,
        label=f"{name} ({setting})",
      )
      left.fill_between(xs, *band([m[(name, s)] for s in xs]), color=f"C{c % 10}", alpha=0.15)
    left.set(
      xscale="log",
      yscale="log",
      xlabel="K transitions of the unseen domain",
      ylabel="next-state MSE / noise floor - 1",
      title="mean over draws, 95% t-interval",
    )
    left.set_xticks(shots, [str(s) for s in shots])
    left.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    left.legend(fontsize=6.5, ncol=2)
    sweep = sorted((a["tau"], n) for n, a in self.spec.arms if a["tau"] is not None and (n, k) in m)
    if sweep:
      taus = [t for t, _ in sweep]
      right.plot(taus, [m[(n, k)].mean for _, n in sweep], "-o", color="C3", label="refined")
      right.fill_between(taus, *band([m[(n, k)] for _, n in sweep]), color="C3", alpha=0.2)
      right.set(xscale="log")
    for c, name in ((0, "global"), (1, "fixed_top1"), (4, "oracle_alpha")):
      if (name, k) in m:
        right.axhline(m[(name, k)].mean, color=f"C{c}", ls="--", lw=1, label=name)
    right.set(yscale="log", xlabel="tau", title=f"zero-shot against tau, K={k}")
    right.legend(fontsize=8)
    s = self.settings
    fig.suptitle(
      f"TMoW on unseen linear-dynamics domains: n={s['dim']}, {s['domains']} "
      f"domains, sigma={s['noise_std']:g}, {self.spec.draws} draws x {s['unseen']} "
      "unseen"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
