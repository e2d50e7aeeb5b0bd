r"""ACE (issue 16, method 4): regret against T of ucb, greedy and lcb when a new
expert arrives every round (moejax/online/ace.py): means iid uniform on [0, 1]
(stochastic), or an oblivious adversary's staircase, a better expert every
~T^{2/3} rounds and decoys of mean --decoy in between (adversarial).

  python -m experiments.ace_study --json=docs/results/mixtures/ace.json \
      --markdown=docs/results/mixtures/ace.md --plot=docs/results/mixtures/ace.png

The claim tested (shared/specs/PAPERS.md; abstract only): over T = 1e3..1e5 the
slope of log mean regret on log T is <= 0.75 for lcb and >= 0.9 for ucb. The
slope is least squares over --horizons; its interval is the 2.5-97.5 percentile
of --resamples bootstrap resamples of the seeds (the same seeds at every T). A
claim holds when the whole interval is on its side, fails when the whole
interval is on the other, and is undecided otherwise. --dense_horizon reruns
that T with the dense lax.scan simulator (its own draws): same law, so the mean
regrets should agree within a few standard errors.
"""
import time

from absl import flags
import jax
import numpy as np

from moejax import cli
from moejax.errors import ConfigError
from moejax.online import ace

VARIANTS = ("stochastic", "adversarial")
CLAIMS = {"lcb": ("<=", 0.75), "ucb": (">=", 0.9)}

_HORIZONS = cli.checked(flags.DEFINE_list(
    "horizons", ["1000", "3000", "10000", "30000", "100000"], "Horizons T."), cli.at_least(1))
_SEEDS = cli.checked(flags.DEFINE_integer("seeds", 50, "Seeds per (variant, policy, T)."),
                     cli.at_least(1))
_POLICIES = cli.checked(flags.DEFINE_list("policies", ["ucb", "greedy", "lcb"], "Policies."),
                        cli.one_of(*ace.POLICIES))
_VARIANTS = cli.checked(flags.DEFINE_list("variants", list(VARIANTS), "Arrival variants."),
                        cli.one_of(*VARIANTS))
_C = cli.checked(flags.DEFINE_float("c", 1.0, "Confidence scale c in sqrt(c log T / n)."),
                 cli.at_least(0, float))
_BLOCK = cli.checked(flags.DEFINE_integer("block", 32, "Rounds per block of the pruned "
                                          "simulator."), cli.at_least(1))
_RESAMPLES = cli.checked(flags.DEFINE_integer("resamples", 2000, "Bootstrap resamples."),
                         cli.at_least(1))
_DECOY = cli.checked(flags.DEFINE_float("decoy", 0.0, "Mean of the adversary's decoys "
                                        "(> 0 lures greedy too, and runs slower)."),
                     cli.in_range(0, 1))
_SEED = cli.checked(flags.DEFINE_integer("seed", 0, "Seeds the means, rewards and bootstrap."),
                    cli.at_least(0))
_DENSE = cli.checked(flags.DEFINE_integer("dense_horizon", 1000, "Rerun this T with the "
                                          "dense simulator (0: skip)."), cli.at_least(0))
_OUTPUTS = cli.study_outputs()


def fit_slopes(horizons, regrets, resamples, rng):
  """Least-squares slope of log mean regret on log T, and its bootstrap over seeds.

  regrets: (len(horizons), seeds). Returns (slope, (lo, hi), resampled means)."""
  x = np.log(np.asarray(horizons, np.float64))
  picks = rng.integers(0, regrets.shape[1], (resamples, regrets.shape[1]))
  means = regrets[:, picks].mean(axis=2)  # (horizons, resamples)
  with np.errstate(divide="ignore", invalid="ignore"):
    def slope(y):
      return ((x - x.mean()) @ (y - y.mean(axis=0))) / ((x - x.mean()) ** 2).sum()
    point = float(slope(np.log(regrets.mean(axis=1))[:, None])[0])
    boot = slope(np.log(means))
  lo, hi = np.percentile(boot, [2.5, 97.5]) if np.all(np.isfinite(boot)) else (np.nan,) * 2
  return point, (float(lo), float(hi)), means


def verdict(policy, interval):
  side, bound = CLAIMS[policy]
  lo, hi = interval
  inside, outside = (hi <= bound, lo > bound) if side == "<=" else (lo >= bound, hi < bound)
  return "holds" if inside else "fails" if outside else "undecided"


def make_means(variant, horizon):
  if variant == "stochastic":
    return ace.stochastic_means(horizon, _SEEDS.value, seed=_SEED.value)
  return ace.adversarial_means(horizon, _SEEDS.value, decoy=_DECOY.value)


def run_study(horizons, log=print):
  runs, start = [], time.perf_counter()
  for variant in _VARIANTS.value:
    for policy in _POLICIES.value:
      for horizon in horizons:
        means = make_means(variant, horizon)
        tick = time.perf_counter()
        regret = ace.simulate(means, policy, seed=_SEED.value + 1, c=_C.value,
                              block=_BLOCK.value)[1]
        runs.append({"variant": variant, "policy": policy, "T": horizon,
                     "mean": float(regret.mean()),
                     "se": float(regret.std(ddof=1) / np.sqrt(len(regret)))
                     if len(regret) > 1 else 0.0,
                     "seconds": time.perf_counter() - tick, "regret": regret.tolist()})
        log(f"{variant:11s} {policy:6s} T={horizon:<6d} regret {runs[-1]['mean']:10.2f} "
            f"+- {runs[-1]['se']:.2f} ({runs[-1]['seconds']:.1f}s)", flush=True)
  return runs, time.perf_counter() - start


def dense_check(horizon, log=print):
  rows = []
  for variant in _VARIANTS.value:
    for policy in _POLICIES.value:
      means = make_means(variant, horizon)
      row = {"variant": variant, "policy": policy, "T": horizon}
      for name, call in (
          ("pruned", lambda: ace.simulate(means, policy, seed=_SEED.value + 1, c=_C.value,
                                          block=_BLOCK.value)[1]),
          ("dense", lambda: ace.simulate_dense(jax.random.key(_SEED.value + 2), means,
                                               policy, c=_C.value)[1])):
        tick = time.perf_counter()
        regret = call()
        row[name] = {"mean": float(regret.mean()), "seconds": time.perf_counter() - tick,
                     "var": float(regret.var(ddof=1)) if len(regret) > 1 else 0.0}
      se = np.sqrt((row["pruned"]["var"] + row["dense"]["var"]) / _SEEDS.value)
      row["z"] = float((row["pruned"]["mean"] - row["dense"]["mean"]) / se) if se else 0.0
      rows.append(row)
      log(f"dense check {variant} {policy}: z={row['z']:.2f}, pruned "
          f"{row['pruned']['seconds']:.1f}s, dense {row['dense']['seconds']:.1f}s", flush=True)
  return rows


def markdown(report) -> str:
  h = report["horizons"]
  out = [f"# ACE: regret against T ({report['settings']['seeds']} seeds, c = "
         f"{report['settings']['c']}, adversary's decoys of mean "
         f"{report['settings']['decoy']})\n", "Mean pseudo-regret sum_t (max_{i<=t} mu_i - "
         "mu_{I_t}) +- standard error over seeds; slope of log mean regret on log T with "
         "a 95% bootstrap interval over seeds; local = slope between consecutive T.\n"]
  for variant in report["settings"]["variants"]:
    out += [f"\n## {variant}\n", "| policy | " + " | ".join(f"T={t:g}" for t in h)
            + " | slope [95%] | local slopes |", "|---" * (len(h) + 3) + "|"]
    for s in (s for s in report["slopes"] if s["variant"] == variant):
      cells = [f"{r['mean']:.4g} +- {r['se'] if r['se'] > 1e-9 * r['mean'] else 0:.2g}"
               for r in report["runs"]
               if r["variant"] == variant and r["policy"] == s["policy"]]
      out.append(f"| {s['policy']} | " + " | ".join(cells) + f" | {s['slope']:.3f} "
                 f"[{s['interval'][0]:.3f}, {s['interval'][1]:.3f}] | "
                 + ", ".join(f"{v:.2f}" for v in s["local"]) + " |")
  out += ["\n## The claim\n", "| variant | policy | claim | slope [95%] | verdict |",
          "|---|---|---|---|---|"]
  out += [f"| {c['variant']} | {c['policy']} | slope {c['claim']} | {c['slope']:.3f} "
          f"[{c['interval'][0]:.3f}, {c['interval'][1]:.3f}] | {c['verdict']} |"
          for c in report["claims"]]
  if report["dense_check"]:
    out += ["\n## Dense (lax.scan + vmap) against pruned (numpy) simulator, own draws\n",
            "| variant | policy | T | pruned mean (s) | dense mean (s) | z |", "|---" * 6 + "|"]
    out += [f"| {r['variant']} | {r['policy']} | {r['T']} | {r['pruned']['mean']:.2f} "
            f"({r['pruned']['seconds']:.1f}) | {r['dense']['mean']:.2f} "
            f"({r['dense']['seconds']:.1f}) | {r['z']:.2f} |" for r in report["dense_check"]]
  out.append(f"\nStudy runtime {report['runtime_s']:.0f} s (pruned simulator, all runs).")
  return "\n".join(out) + "\n"


def plot(report, path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  variants = report["settings"]["variants"]
  fig, axes = plt.subplots(1, len(variants), figsize=(5.5 * len(variants), 4.2), squeeze=False)
  h = np.asarray(report["horizons"], np.float64)
  for ax, variant in zip(axes[0], variants):
    for s in (s for s in report["slopes"] if s["variant"] == variant):
      mean = [r["mean"] for r in report["runs"]
              if r["variant"] == variant and r["policy"] == s["policy"]]
      line, = ax.plot(h, mean, "o-", label=f"{s['policy']} (slope {s['slope']:.2f})")
      ax.fill_between(h, s["band"][0], s["band"][1], color=line.get_color(), alpha=0.25)
    low = min(r["mean"] for r in report["runs"] if r["variant"] == variant)
    for power, style in ((1.0, ":"), (2 / 3, "--")):
      ax.plot(h, low * (h / h[0]) ** power, "k" + style, lw=0.8, label=f"T^{power:.2g}")
    ax.set(xscale="log", yscale="log", xlabel="T", ylabel="regret", title=variant)
    ax.legend(fontsize=8)
  fig.suptitle("ACE: mean regret, 95% bootstrap band over seeds")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  _OUTPUTS.check()
  horizons = sorted({int(t) for t in _HORIZONS.value})
  if len(horizons) < 2:
    raise ConfigError(f"expected at least two distinct horizons "
                      f"(--horizons={','.join(_HORIZONS.value)})")
  ace.check(c=_C.value)
  runs, runtime = run_study(horizons)
  rng = np.random.default_rng(_SEED.value)
  slopes, claims = [], []
  for variant in _VARIANTS.value:
    for policy in _POLICIES.value:
      regrets = np.array([r["regret"] for r in runs
                          if r["variant"] == variant and r["policy"] == policy])
      slope, interval, means = fit_slopes(horizons, regrets, _RESAMPLES.value, rng)
      with np.errstate(divide="ignore", invalid="ignore"):
        local = np.diff(np.log(regrets.mean(axis=1))) / np.diff(np.log(horizons))
      slopes.append({"variant": variant, "policy": policy, "slope": slope,
                     "interval": interval, "local": local.tolist(),
                     "band": np.percentile(means, [2.5, 97.5], axis=1).tolist()})
      if policy in CLAIMS:
        claims.append({"variant": variant, "policy": policy, "slope": slope,
                       "interval": interval, "claim": " ".join(map(str, CLAIMS[policy])),
                       "verdict": verdict(policy, interval)})
  report = {"settings": {"seeds": _SEEDS.value, "c": _C.value, "decoy": _DECOY.value,
                         "block": _BLOCK.value,
                         "resamples": _RESAMPLES.value, "seed": _SEED.value,
                         "policies": _POLICIES.value, "variants": _VARIANTS.value},
            "horizons": horizons, "runs": runs, "slopes": slopes, "claims": claims,
            "dense_check": dense_check(_DENSE.value) if _DENSE.value else [],
            "runtime_s": runtime}
  text = markdown(report)
  print(text)
  _OUTPUTS.write(report, text, lambda path: plot(report, path))


if __name__ == "__main__":
  cli.run(main)
