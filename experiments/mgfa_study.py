r"""MGFA vs a vMF mixture vs a Euclidean GMM on anisotropic clusters on spheres, and the
Frechet mean's error against n (issue 16, method 3; moejax/mixtures/sphere.py).

  python -m experiments.mgfa_study --json=docs/results/mixtures/mgfa.json \
      --markdown=docs/results/mixtures/mgfa.md --plot=docs/results/mixtures/mgfa.png

Clusters (ours; the paper's data are not known): in a random orthonormal frame e1,
e2, e3 of R^d, K mean directions on the great circle through e1 and e2, `spacing`
rad apart; cluster j is Exp_mu_j(v), v Gaussian in the tangent space with std
`major` along e3 (tangent at every mu_j) and `minor` along the other d-2 tangent
directions: K parallel bands (MGFA's own model family with q = 1), which an
isotropic model prefers to cut across once major is well above spacing. The first
--majors value is the headline; the others are controls (major = minor: isotropic).
Each method keeps the best (training log-likelihood) of `restarts` k-means++ fits,
the same seeds for all. ARI on the training points; held-out log-likelihood per
point on as many fresh points, w.r.t. the surface measure: the GMM's density is
restricted to the sphere and renormalised (`sphere_log_normalisers`).
Frechet mean: `frechet_trials` samples of n points of one headline band; geodesic
error of the sample Frechet mean; OLS slope of log mean error on log n, with a
bootstrap (over trials) 95% interval.
"""
import sys
import time

from absl import flags
import numpy as np

from moejax import cli

_DIMS = cli.checked(flags.DEFINE_list("dims", ["3", "11"], "Ambient dimensions d (the "
                                      "sphere S^{d-1}); at least 3."), cli.at_least(3))
_MAJORS = cli.checked(flags.DEFINE_list("majors", ["0.5", "0.05"], "Tangent stds along the "
                                        "bands (rad); the first is the headline."),
                      cli.in_range(0, 1.0, low_open=True))
_MINOR = cli.checked(flags.DEFINE_float("minor", 0.05, "Tangent std across (rad)."),
                     cli.in_range(0, 1.0, low_open=True))
_SPACING = cli.checked(flags.DEFINE_float("spacing", 0.4, "Angle between neighbouring "
                                          "means (rad)."), cli.in_range(0, 3.0, low_open=True))
_CLUSTERS = cli.checked(flags.DEFINE_integer("clusters", 3, "Clusters K."), cli.at_least(1))
_POINTS = cli.checked(flags.DEFINE_integer("points", 200, "Training (and test) points per "
                                           "cluster."), cli.at_least(1))
_FACTORS = cli.checked(flags.DEFINE_integer("factors", 1, "MGFA factors q (<= d-2)."),
                       cli.at_least(0))
_SEEDS = cli.checked(flags.DEFINE_integer("seeds", 10, "Data sets per row."), cli.at_least(2))
_RESTARTS = cli.checked(flags.DEFINE_integer("restarts", 3, "Initialisations per fit."),
                        cli.at_least(1))
_MAX_STEPS = cli.checked(flags.DEFINE_integer("max_steps", 200, "EM steps at most."),
                         cli.at_least(1))
_NS = cli.checked(flags.DEFINE_list("frechet_ns", ["25", "50", "100", "200", "400", "800",
                                                    "1600", "3200"], "Sample sizes n."),
                  cli.at_least(2))
_TRIALS = cli.checked(flags.DEFINE_integer("frechet_trials", 200, "Samples per n."),
                      cli.at_least(2))
_SEED = cli.checked(flags.DEFINE_integer("seed", 0, "Base seed."), cli.at_least(0))
_OUTPUTS = cli.study_outputs()

METHODS = ("mgfa", "mgfa_q0", "vmf", "gmm_diag")
NAMES = {"mgfa": "MGFA (q={q})", "mgfa_q0": "MGFA q=0 (isotropic tangent)",
         "vmf": "vMF mixture", "gmm_diag": "Euclidean GMM, diagonal"}


def bands(rng, d, k, n, *, spacing, major, minor):
  """(x [k n, d] float32 unit vectors, labels [k n], means [k, d]), as the docstring."""
  import jax.numpy as jnp
  from moejax.mixtures import sphere
  e1, e2, e3 = np.linalg.qr(rng.standard_normal((d, d)))[0].T[:3]
  angles = (np.arange(k) - (k - 1) / 2) * spacing
  means = np.cos(angles)[:, None] * e1 + np.sin(angles)[:, None] * e2
  labels = np.repeat(np.arange(k), n)
  mu, g = means[labels], rng.standard_normal((k * n, d))
  v = minor * (g - np.sum(g * mu, 1, keepdims=True) * mu) + (major - minor) * np.outer(g @ e3, e3)
  x = np.asarray(sphere.exp_map(jnp.asarray(mu), jnp.asarray(v)), np.float64)
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), labels, means


def sphere_log_normalisers(means, variances, rng, samples: int = 4000) -> np.ndarray:
  """[K] log Z_k, Z_k = integral over S^{d-1} of N(x; m_k, diag(s_k^2)) dS, by importance
  sampling from the projected normal (x = y / |y|, y ~ N(m_k, diag s_k^2)), whose density
  on the sphere is int_0^inf r^{d-1} N(r x) dr (quadrature around the integrand's mode):
  log w(x) = -(a - 2b)/2 - log int_0^inf r^{d-1} exp(-a r^2 / 2 + b r) dr,
  a = sum x^2 / s^2, b = sum x m / s^2."""
  means = np.asarray(means, np.float64)
  variances = np.broadcast_to(np.asarray(variances, np.float64).reshape(len(means), -1),
                              means.shape)
  d, out, u = means.shape[1], [], np.linspace(0.0, 1.0, 801)
  trapezoid = np.log(np.r_[0.5, np.ones(len(u) - 2), 0.5])
  for m, s2 in zip(means, variances):
    y = m + np.sqrt(s2) * rng.standard_normal((samples, d))
    x = y / np.linalg.norm(y, axis=1, keepdims=True)
    a, b = np.sum(x * x / s2, 1), np.sum(x * m / s2, 1)
    mode = (b + np.sqrt(b * b + 4 * a * (d - 1))) / (2 * a)
    width = 1 / np.sqrt(a + (d - 1) / mode ** 2)
    lo, hi = np.maximum(mode - 14 * width, 0.0), mode + 14 * width
    r = lo[:, None] + (hi - lo)[:, None] * u[None]
    with np.errstate(divide="ignore"):
      f = (d - 1) * np.log(r) - a[:, None] * r * r / 2 + b[:, None] * r
    log_integral = np.logaddexp.reduce(f + trapezoid, axis=1) + np.log((hi - lo) / (len(u) - 1))
    out.append(np.logaddexp.reduce(-(a - 2 * b) / 2 - log_integral) - np.log(samples))
  return np.asarray(out)


def fit_best(method, x, k, seeds):
  """(EM steps, model) of the fit of largest training log-likelihood over the seeds."""
  from moejax.mixtures import gmm, sphere
  fits = []
  for seed in seeds:
    if method == "gmm_diag":
      model, history = gmm.fit(x, k, seed=seed, diagonal=True, max_steps=_MAX_STEPS.value)
    elif method == "vmf":
      model, history = sphere.fit_vmf(x, k, seed=seed, max_steps=_MAX_STEPS.value)
    else:
      q = _FACTORS.value if method == "mgfa" else 0
      model, history = sphere.fit_mgfa(x, k, q, seed=seed, max_steps=_MAX_STEPS.value)
    fits.append((history[-1], len(history) - 1, model))
  return max(fits, key=lambda f: f[0])[1:]


def held_out_loglik(method, model, x, rng) -> float:
  """Mean log-likelihood per point w.r.t. the surface measure of the sphere."""
  import jax.numpy as jnp
  from moejax.mixtures import gmm, sphere
  if method != "gmm_diag":
    return sphere.log_likelihood(x, model) / len(x)
  joint = np.asarray(gmm.log_joint(jnp.asarray(x), model), np.float64)
  log_z = sphere_log_normalisers(model.means, model.variances, rng)
  log_mass = np.logaddexp.reduce(np.log(np.asarray(model.weights, np.float64)) + log_z)
  return float(np.mean(np.logaddexp.reduce(joint, axis=1)) - log_mass)


def spread(values, resamples: int = 2000) -> dict:
  """Mean, std and the bootstrap (percentile) 95% interval of the mean."""
  values = np.asarray(values, np.float64)
  picks = np.random.default_rng(0).integers(0, values.size, (resamples, values.size))
  low, high = np.percentile(values[picks].mean(1), [2.5, 97.5])
  return {"mean": float(values.mean()), "std": float(values.std(ddof=1)),
          "ci95": [float(low), float(high)]}


def clustering_row(d: int, major: float) -> dict:
  from moejax.evaluation.partitions import adjusted_rand_index
  from moejax.mixtures import gmm, sphere
  k, n = _CLUSTERS.value, _POINTS.value
  runs = {m: {"ari": [], "test_loglik": [], "steps": []} for m in METHODS}
  for s in range(_SEEDS.value):
    rng = np.random.default_rng((_SEED.value, d, round(major * 1000), s))
    both, labels, _ = bands(rng, d, k, 2 * n, spacing=_SPACING.value, major=major,
                            minor=_MINOR.value)  # one frame for the training and test points
    x, x_test, labels = both[0::2], both[1::2], labels[0::2]
    for method in METHODS:
      steps, model = fit_best(method, x, k, [[_SEED.value, s, r] for r in range(_RESTARTS.value)])
      predict = gmm.predict if method == "gmm_diag" else sphere.predict
      runs[method]["ari"].append(adjusted_rand_index(labels, predict(x, model)))
      runs[method]["test_loglik"].append(held_out_loglik(method, model, x_test, rng))
      runs[method]["steps"].append(steps)
  diff = lambda key: spread(np.subtract(runs["mgfa"][key], runs["vmf"][key]))  # noqa: E731
  return {"d": d, "sphere": f"S^{d - 1}", "major": major,
          **{m: {"ari": spread(r["ari"]), "test_loglik": spread(r["test_loglik"]),
                 "steps": float(np.mean(r["steps"])), "ari_each": r["ari"]}
             for m, r in runs.items()},
          "mgfa_minus_vmf": {"ari": diff("ari"), "test_loglik": diff("test_loglik")}}


def frechet_row(d: int) -> dict:
  """Geodesic error of the sample Frechet mean of one headline band against n."""
  import jax.numpy as jnp
  from moejax.mixtures import sphere
  ns, trials = sorted(map(int, _NS.value)), _TRIALS.value
  rng = np.random.default_rng((_SEED.value, d, 10**6))
  errors = np.zeros((len(ns), trials))
  for i, n in enumerate(ns):
    for t in range(trials):
      x, _, means = bands(rng, d, 1, n, spacing=0.0, major=float(_MAJORS.value[0]),
                          minor=_MINOR.value)
      mean = sphere.frechet_mean(x)
      errors[i, t] = float(sphere.geodesic_distance(mean, jnp.asarray(means[0], mean.dtype)))
  slope = lambda e: float(np.polyfit(np.log(ns), np.log(e.mean(1)), 1)[0])  # noqa: E731
  boot = np.random.default_rng(1)
  slopes = [slope(np.take_along_axis(errors, boot.integers(0, trials, errors.shape), 1))
            for _ in range(2000)]
  return {"d": d, "ns": ns, "mean_error": errors.mean(1).tolist(),
          "error_ci95": [spread(e, 500)["ci95"] for e in errors], "slope": slope(errors),
          "slope_ci95": np.percentile(slopes, [2.5, 97.5]).tolist()}


def claims(rows, frechet) -> list[str]:
  verdict = lambda ok: "reproduced" if ok else "NOT reproduced"  # noqa: E731
  interval = lambda s: f"{s['mean']:+.3f} [{s['ci95'][0]:+.3f}, {s['ci95'][1]:+.3f}]"  # noqa
  out = []
  for r in rows:
    diff = r["mgfa_minus_vmf"]
    headline = r["major"] == float(_MAJORS.value[0])
    out.append(f"- {r['sphere']}, major {r['major']:g}{'' if headline else ' (control)'}: "
               f"ARI MGFA {r['mgfa']['ari']['mean']:.3f} vs vMF {r['vmf']['ari']['mean']:.3f}, "
               f"paired difference {interval(diff['ari'])}; held-out log-lik difference "
               f"{interval(diff['test_loglik'])}" + (
                   f" (paper: MGFA > isotropic mixture): {verdict(diff['ari']['ci95'][0] > 0)}."
                   if headline else "."))
  for f in frechet:
    lo, hi = f["slope_ci95"]
    out.append(f"- S^{f['d'] - 1}: Frechet-mean error slope {f['slope']:.3f} [{lo:.3f}, "
               f"{hi:.3f}] in log-log (paper: n^-1/2): {verdict(lo <= -0.5 <= hi)}.")
  return out


def tables(rows, frechet) -> str:
  cell = lambda s: (f"{s['mean']:.3f} ± {s['std']:.3f} "  # noqa: E731
                    f"[{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]")
  lines = ["| sphere | major | method | ARI (train) | held-out log-lik / point | EM steps |",
           "|---|---|---|---|---|---|"]
  lines += [f"| {r['sphere']} | {r['major']:g} | {NAMES[m].format(q=_FACTORS.value)} | "
            f"{cell(r[m]['ari'])} | {cell(r[m]['test_loglik'])} | {r[m]['steps']:.0f} |"
            for r in rows for m in METHODS]
  ns = frechet[0]["ns"]
  lines += ["", f"### Frechet-mean geodesic error (rad), mean over {_TRIALS.value} samples "
            "of one headline band", "", "| sphere | " + " | ".join(f"n={n}" for n in ns) +
            " | slope [95%] |", "|---|" + "---|" * (len(ns) + 1)]
  lines += [f"| S^{f['d'] - 1} | " + " | ".join(f"{e:.4f}" for e in f["mean_error"]) +
            f" | {f['slope']:.3f} [{f['slope_ci95'][0]:.3f}, {f['slope_ci95'][1]:.3f}] |"
            for f in frechet]
  return "\n".join(lines)


def plot(rows, frechet, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  width = 0.8 / len(METHODS)
  for j, m in enumerate(METHODS):
    xs = np.arange(len(rows)) + (j - (len(METHODS) - 1) / 2) * width
    for ax, key in zip(axes[:2], ("ari", "test_loglik")):
      mean = np.array([r[m][key]["mean"] for r in rows])
      ci = np.array([r[m][key]["ci95"] for r in rows]).T
      ax.bar(xs, mean, width, color=f"C{j}", alpha=0.7, label=NAMES[m].format(q=_FACTORS.value))
      ax.errorbar(xs, mean, yerr=[r[m][key]["std"] for r in rows], fmt="none", ecolor="gray",
                  capsize=2)
      ax.errorbar(xs, mean, yerr=[mean - ci[0], ci[1] - mean], fmt="none", ecolor="black",
                  capsize=4, lw=2)
  for ax, title in zip(axes[:2], ("ARI with the true bands", "held-out log-lik per point")):
    ax.set_xticks(np.arange(len(rows)), [f"{r['sphere']}\nmajor {r['major']:g}" for r in rows])
    ax.set_title(f"{title}\n(bar: mean; black: 95% CI; gray: ± std over seeds)")
  axes[0].legend(fontsize=8)
  for c, f in enumerate(frechet):
    ci = np.array(f["error_ci95"]).T
    axes[2].loglog(f["ns"], f["mean_error"], "o-", color=f"C{c}",
                   label=f"S^{f['d'] - 1}: slope {f['slope']:.2f}")
    axes[2].fill_between(f["ns"], ci[0], ci[1], color=f"C{c}", alpha=0.25)
  ns = np.asarray(frechet[0]["ns"], float)
  axes[2].loglog(ns, frechet[0]["mean_error"][0] * (ns / ns[0]) ** -0.5, "k:", label="n^-1/2")
  axes[2].set(xlabel="n", ylabel="mean geodesic error (rad)",
              title="Frechet mean error (95% CI band)")
  axes[2].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  _OUTPUTS.check()
  dims = sorted(set(map(int, _DIMS.value)))
  if not dims or not _MAJORS.value:
    raise cli.flag_error(_DIMS if not dims else _MAJORS, "expected at least one value")
  if _FACTORS.value > dims[0] - 2:
    raise cli.flag_error(_FACTORS, f"expected q <= d-2 = {dims[0] - 2} for every d "
                         f"(--dims={','.join(_DIMS.value)})")
  if len(set(map(int, _NS.value))) < 2:
    raise cli.flag_error(_NS, "expected at least two distinct sample sizes")
  start = time.time()
  rows = [clustering_row(d, float(major)) for d in dims for major in _MAJORS.value]
  frechet = [frechet_row(d) for d in dims]
  seconds = time.time() - start
  command = "python -m experiments.mgfa_study " + " ".join(sys.argv[1:])
  text = "\n".join([
      f"Command: `{command}` ({seconds:.0f} s on CPU).", "",
      f"Setting: K={_CLUSTERS.value} parallel bands on S^{{d-1}}, means {_SPACING.value:g} "
      f"rad apart on a great circle, tangent std `major` along the bands and {_MINOR.value:g} "
      f"rad across (every other tangent direction); major {_MAJORS.value[0]} is the headline, "
      "major = minor an isotropic control. Data come from MGFA's own family (q=1). "
      f"{_POINTS.value} training and {_POINTS.value} held-out points per band, "
      f"{_SEEDS.value} data seeds per row; each method keeps the best of {_RESTARTS.value} "
      "k-means++ initialisations (training log-likelihood). Cells: mean ± std over seeds "
      "[bootstrap 95% interval of the mean]. Log-likelihoods per point w.r.t. the surface "
      "measure; MGFA's drops the tangent mass beyond the cut locus (negligible here), the "
      "GMM's R^d density is restricted to the sphere and renormalised (importance "
      "sampling). The diagonal GMM's axes are the ambient ones, not the bands'.", "",
      "### The paper's claims", "", *claims(rows, frechet), "",
      "### Clustering and held-out likelihood", "", tables(rows, frechet)])
  print(text)
  names = ("dims", "majors", "minor", "spacing", "clusters", "points", "factors", "seeds",
           "restarts", "max_steps", "frechet_ns", "frechet_trials", "seed")
  record = {"settings": {**{n: flags.FLAGS[n].value for n in names}, "command": command,
                         "seconds": seconds}, "clustering": rows, "frechet": frechet}
  _OUTPUTS.write(record, text, lambda path: plot(rows, frechet, path))


if __name__ == "__main__":
  cli.run(main)
