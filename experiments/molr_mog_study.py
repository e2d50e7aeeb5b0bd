r"""MoLR-MoG study (issue 16, method 5; moejax/mixtures/score_mixture.py and score_networks.py): how close
to the true score do the MoE-latent-MoG, the MoE-latent-Gaussian and a plain MLP at
equal parameters get, per noise level and against the number of training points n?

  python -m experiments.molr_mog_study --json=docs/results/mixtures/molr_mog.json \
      --markdown=docs/results/mixtures/molr_mog.md --plot=docs/results/mixtures/molr_mog.png

Each seed draws an instance (make_mixture: Haar bases, latent means N(0, mean_scale^2
I), latent covariance I, equal weights), nested training sets (the first n of one
draw), the model initialisation and the noise. The MoE networks start from
init_from_data (subspace seeding and per-expert k-means; the *_random variants from a
random start); all are trained by DSM (sigma log-uniform on [sigma_min, sigma_max])
and scored by the relative score error E|s_theta - s|^2 / E|s|^2 at each noise level
on fresh points. Also reported: that error at the start, the held-out DSM loss above
the true score's (same points and noise), and the largest principal angle between
learned and true subspaces (best matching of experts).
"""
import itertools
import json
import math
import sys
import time

from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from moejax import cli
from moejax.errors import ConfigError
from moejax.mixtures import score_mixture as sm
from moejax.mixtures import score_networks as sn

_POSITIVE = cli.in_range(0, float("inf"), low_open=True)
_DIM = cli.checked(flags.DEFINE_integer("dim", 64, "Ambient dimension D."), cli.at_least(1))
_SUBSPACES = cli.checked(flags.DEFINE_integer("subspaces", 3, "Subspaces K (and experts)."),
                         cli.at_least(1))
_LATENT = cli.checked(flags.DEFINE_integer("latent_dim", 4, "Subspace dimension d."),
                      cli.at_least(1))
_COMPONENTS = cli.checked(flags.DEFINE_integer("components", 3, "Latent components n_k."),
                          cli.at_least(1))
_MEAN_SCALE = cli.checked(flags.DEFINE_float("mean_scale", 3.0, "Std of the latent means."),
                          _POSITIVE)
_SIGMAS = cli.checked(flags.DEFINE_list("sigmas", ["0.1", "0.3", "1", "3", "10"],
                                        "Noise levels at which the score error is measured."),
                      _POSITIVE)
_N_TRAIN = cli.checked(flags.DEFINE_integer("n_train", 2048, "Training points (noise "
                                            "study)."), cli.at_least(1))
_N_VALUES = cli.checked(flags.DEFINE_list("n_values", ["128", "256", "512", "1024", "2048",
                                                       "4096"], "Training points (n study)."),
                        cli.at_least(1))
_N_SIGMA = cli.checked(flags.DEFINE_float("n_sigma", 1.0, "Noise level of the n study "
                                          "(one of --sigmas)."), _POSITIVE)
_SEEDS = cli.checked(flags.DEFINE_integer("seeds", 3, "Seeds (instances)."), cli.at_least(1))
_STEPS = cli.checked(flags.DEFINE_integer("steps", 3000, "Adam steps."), cli.at_least(1))
_BATCH = cli.checked(flags.DEFINE_integer("batch_size", 256, "Batch size."), cli.at_least(1))
_LR = cli.checked(flags.DEFINE_float("learning_rate", 1e-2, "Adam learning rate."), _POSITIVE)
_SIGMA_MIN = cli.checked(flags.DEFINE_float("sigma_min", 0.05, "Smallest training sigma."),
                         _POSITIVE)
_SIGMA_MAX = cli.checked(flags.DEFINE_float("sigma_max", 20.0, "Largest training sigma."),
                         _POSITIVE)
_EVAL = cli.checked(flags.DEFINE_integer("eval_samples", 4096, "Points per evaluation."),
                    cli.at_least(1))
NAMES = {"mog": "MoE-latent-MoG", "gaussian": "MoE-latent-Gaussian",
         "mlp": "MLP (equal params)", "mlp10": "MLP (10x params)",
         "mog_random": "MoE-latent-MoG, random start",
         "gaussian_random": "MoE-latent-Gaussian, random start"}
_MODELS = cli.checked(flags.DEFINE_list("models", list(NAMES), "Models of the noise study."),
                      cli.one_of(*NAMES))
_N_MODELS = cli.checked(flags.DEFINE_list("n_models", ["mog", "gaussian", "mlp"],
                                          "Models of the n study."), cli.one_of(*NAMES))
_OUTPUTS = cli.study_outputs()


def build(name, settings, seed, data):
  """A fresh model (MoE ones started by init_from_data unless *_random); the MLPs'
  widths match 1x or 10x the MoE-latent-MoG's parameters."""
  d, k, latent, comps = (settings[key] for key in ("dim", "subspaces", "latent_dim",
                                                   "components"))
  rngs = nnx.Rngs(2000 + seed)
  if name.startswith(("mog", "gaussian")):
    model = (sn.MoELatentMoG(d, k, latent, comps, rngs=rngs) if name.startswith("mog")
             else sn.MoELatentGaussian(d, k, latent, rngs=rngs))
    if not name.endswith("_random"):
      sn.init_from_data(model, data, seed=seed)
    return model
  target = sn.count_params(sn.MoELatentMoG(d, k, latent, comps, rngs=nnx.Rngs(0)))
  width = sn.mlp_width(target * (10 if name == "mlp10" else 1), d)
  return sn.ScoreMLP(d, width, rngs=rngs, data_std=float(jnp.sqrt(jnp.mean(data ** 2))))


def subspace_angle(true_bases, learned_bases) -> float:
  """Largest principal angle (degrees) between true and learned subspaces under the
  expert matching that minimises it (all K! matchings; K is small); from the sine,
  |(I - U U^T) V|_2, in float64 (the cosine loses small angles to rounding)."""
  true_bases, learned_bases = (np.asarray(b, np.float64) for b in (true_bases, learned_bases))
  residual = learned_bases[None] - np.einsum("kDi,kEi,jEl->kjDl", true_bases, true_bases,
                                              learned_bases)
  sines = np.linalg.norm(residual, ord=2, axis=(2, 3))  # [K true, K learned]
  k = len(true_bases)
  best = min(max(sines[i, p[i]] for i in range(k))
             for p in itertools.permutations(range(len(learned_bases)), k))
  return float(np.degrees(np.arcsin(min(best, 1.0))))


def run_one(name, settings, mix, data, seed):
  """Train one model on `data`; its score errors, held-out DSM excess and angle."""
  model = build(name, settings, seed, data)
  start = {s: sm.score_error(model, mix, float(s), num_samples=settings["eval_samples"],
                             seed=4000 + seed) for s in settings["sigmas"]}
  rows = max(len(data), 4096)  # tile n | rows points: uniform batches, one compile for all n
  tiled = jnp.tile(data, (rows // len(data), 1)) if rows % len(data) == 0 else data
  losses = sn.train_dsm(model, tiled, steps=settings["steps"], seed=3000 + seed,
                        batch_size=settings["batch_size"],
                        learning_rate=settings["learning_rate"],
                        sigma_range=(settings["sigma_min"], settings["sigma_max"]))
  errors = {s: sm.score_error(model, mix, float(s), num_samples=settings["eval_samples"],
                              seed=4000 + seed) for s in settings["sigmas"]}
  keys = jax.random.split(jax.random.key(5000 + seed), 3)
  held = sm.sample(mix, settings["eval_samples"], 6000 + seed)
  log_lo, log_hi = np.log(settings["sigma_min"]), np.log(settings["sigma_max"])
  sigma = jnp.exp(jax.random.uniform(keys[0], (len(held),), minval=log_lo, maxval=log_hi))
  noise = jax.random.normal(keys[1], held.shape)
  true_fn = lambda x, s: sm.molr_mog_score(x, s, mix)  # noqa: E731
  excess = float(sn.dsm_loss(model, held, sigma, noise) - sn.dsm_loss(true_fn, held, sigma,
                                                                      noise))
  out = {"score_error": errors, "start_score_error": start, "dsm_excess": excess,
         "params": sn.count_params(model),
         "final_train_loss": float(jnp.mean(losses[-200:]))}
  if name.startswith(("mog", "gaussian")):
    out["max_angle_deg"] = subspace_angle(np.asarray(mix.bases),
                                          np.asarray(sn.orthonormal(model.bases_raw[...])))
  return out


def stats(values) -> dict:
  values = np.asarray(values, float)
  return {"mean": float(values.mean()), "std": float(values.std()),
          "min": float(values.min()), "max": float(values.max())}


def slope(ns, errors) -> float:
  """Least-squares slope of log error against log n."""
  return float(np.polyfit(np.log(ns), np.log(errors), 1)[0])


def summarise(runs, settings):
  seeds, sig = range(settings["seeds"]), settings["n_sigma"]
  noise = {m: {"params": runs[(m, 0, settings["n_train"])]["params"],
               "score_error": {s: stats([runs[(m, i, settings["n_train"])]["score_error"][s]
                                         for i in seeds]) for s in settings["sigmas"]},
               "start_score_error": stats([runs[(m, i, settings["n_train"])]
                                           ["start_score_error"][sig] for i in seeds]),
               **{key: stats([runs[(m, i, settings["n_train"])][key] for i in seeds])
                  for key in ("dsm_excess", "max_angle_deg")
                  if key in runs[(m, 0, settings["n_train"])]}} for m in settings["models"]}
  ns = settings["n_values"]
  by_n = {m: {"score_error": {n: stats([runs[(m, i, n)]["score_error"][sig] for i in seeds])
                              for n in ns},
              **{f"{start}slope": stats([slope(ns, [runs[(m, i, n)][f"{start}score_error"][sig]
                                                    for n in ns]) for i in seeds])
                 if len(ns) > 1 else None for start in ("", "start_")}}
          for m in settings["n_models"]}
  return {"noise": noise, "n": by_n}


def tables(summary, settings) -> str:
  fmt = lambda s: f"{s['mean']:.2e} ± {s['std']:.1e}"  # noqa: E731
  models, sigmas = settings["models"], settings["sigmas"]
  lines = [f"D = {settings['dim']}, K = {settings['subspaces']}, d_k = "
           f"{settings['latent_dim']}, n_k = {settings['components']}, latent means "
           f"N(0, {settings['mean_scale']}^2 I), latent covariance I; {settings['steps']} "
           f"Adam steps, batch {settings['batch_size']}, lr {settings['learning_rate']}, "
           f"training sigma log-uniform on [{settings['sigma_min']}, {settings['sigma_max']}]; "
           f"mean ± std over {settings['seeds']} seeds.", "",
           f"### Relative score error E|s_theta - s|^2 / E|s|^2 by noise level "
           f"(n = {settings['n_train']})", "",
           "| model | params | " + " | ".join(f"sigma={s}" for s in sigmas)
           + f" | at start, sigma={settings['n_sigma']} | held-out DSM excess | "
           "max subspace angle (deg) |", "|---" * (5 + len(sigmas)) + "|"]
  for m in models:
    row = summary["noise"][m]
    angle = (f"{row['max_angle_deg']['mean']:.2f} ± {row['max_angle_deg']['std']:.2f}"
             if "max_angle_deg" in row else "-")
    lines.append(f"| {NAMES[m]} | {row['params']} | "
                 + " | ".join(fmt(row["score_error"][s]) for s in sigmas)
                 + f" | {fmt(row['start_score_error'])} | {fmt(row['dsm_excess'])} | {angle} |")
  ns = settings["n_values"]
  lines += ["", f"### Relative score error against n (sigma = {settings['n_sigma']})", "",
            "| model | " + " | ".join(f"n={n}" for n in ns)
            + " | log-log slope | slope at start |", "|---" * (3 + len(ns)) + "|"]
  fit = lambda f: f"{f['mean']:.2f} ± {f['std']:.2f}" if f else "-"  # noqa: E731
  for m in settings["n_models"]:
    row = summary["n"][m]
    lines.append(f"| {NAMES[m]} | " + " | ".join(fmt(row["score_error"][n]) for n in ns)
                 + f" | {fit(row['slope'])} | {fit(row['start_slope'])} |")
  return "\n".join(lines + claims(summary, settings))


def paired_claims(runs, settings) -> list[str]:
  """latent-MoG against latent-Gaussian on the same seeds: the paired difference of
  log10 score error per noise level and of held-out DSM excess, mean ± std [95%
  interval] and seed_stats' verdict (paper: lower)."""
  from moejax.train import seed_stats
  if not {"mog", "gaussian"} <= set(settings["models"]):
    return []
  n, seeds = settings["n_train"], range(settings["seeds"])
  value = lambda m, pick: [pick(runs[(m, i, n)]) for i in seeds]  # noqa: E731
  rows = [(f"log10 score error, sigma={s}",
           [math.log10(v) for v in value(m, lambda r: r["score_error"][s])])
          for s in settings["sigmas"] for m in ("mog", "gaussian")]
  pairs = [(rows[i][0], rows[i][1], rows[i + 1][1]) for i in range(0, len(rows), 2)]
  pairs.append(("held-out DSM excess", value("mog", lambda r: r["dsm_excess"]),
                value("gaussian", lambda r: r["dsm_excess"])))
  out = ["", "### latent-MoG - latent-Gaussian, paired over seeds", "",
         "| quantity | difference | verdict (paper: lower) |", "|---|---|---|"]
  for name, mog, gaussian in pairs:
    d = seed_stats.paired_difference(mog, gaussian)
    interval = (f"{d.mean:+.3f} ± {d.std:.3f} [{d.lo:+.3f}, {d.hi:+.3f}]" if d.lo is not None
                else f"{d.mean:+.3f}")
    out.append(f"| {name} | {interval} | {seed_stats.verdict(d, 'lower', '{:.3f}')} |")
  return out


def claims(summary, settings) -> list[str]:
  """The spec's small-scale claims, each with the measured numbers."""
  noise, by_n, sigmas = summary["noise"], summary["n"], settings["sigmas"]
  mean = lambda m, s: noise[m]["score_error"][s]["mean"]  # noqa: E731
  out = ["", "### Claims"]
  if {"mog", "gaussian"} <= set(noise):
    wins = [s for s in sigmas if mean("mog", s) < mean("gaussian", s)]
    lower = noise["mog"]["dsm_excess"]["mean"] < noise["gaussian"]["dsm_excess"]["mean"]
    out.append(f"- latent-MoG below latent-Gaussian: held-out DSM excess "
               f"{noise['mog']['dsm_excess']['mean']:.3g} vs "
               f"{noise['gaussian']['dsm_excess']['mean']:.3g} ({'yes' if lower else 'no'}); "
               f"lower mean score error at {len(wins)} of {len(sigmas)} noise levels.")
  if "mog" in by_n and by_n["mog"]["slope"]:
    fit = by_n["mog"]["slope"]["mean"]
    out.append(f"- error against n, log-log slope (paper: about -1/2): squared relative "
               f"error {fit:.2f}, so its square root (an L2 error) {fit / 2:.2f}.")
  if {"mog", "mlp10"} <= set(noise):
    ratios = ", ".join(f"{mean('mlp10', s) / mean('mog', s):.3g}" for s in sigmas)
    out.append(f"- against an MLP with 10x the parameters (the paper's baseline is a U-Net): "
               f"MLP error / latent-MoG error at sigma = {', '.join(sigmas)}: {ratios}.")
  return out


def plot(summary, settings, path):
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import ticker
  import matplotlib.pyplot as plt
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for axis, part, xs, keys in ((left, "noise", [float(s) for s in settings["sigmas"]],
                                settings["sigmas"]),
                               (right, "n", settings["n_values"], settings["n_values"])):
    for m, row in summary[part].items():
      cells = [row["score_error"][k] for k in keys]
      axis.plot(xs, [c["mean"] for c in cells], "o-", label=NAMES[m])
      axis.fill_between(xs, [c["min"] for c in cells], [c["max"] for c in cells], alpha=0.2)
    axis.set(xscale="log", yscale="log", ylabel="relative score error")
  ns = np.asarray(settings["n_values"], float)
  if "mog" in summary["n"]:  # a 1/n guide through the first MoE-latent-MoG point
    first = summary["n"]["mog"]["score_error"][settings["n_values"][0]]["mean"]
    right.plot(ns, first * ns[0] / ns, "k:", label="slope -1")
  right.set_xticks(ns, [str(int(n)) for n in ns], minor=False)
  right.xaxis.set_minor_formatter(ticker.NullFormatter())
  for axis in (left, right):
    axis.legend(fontsize=7)
  left.set(xlabel="noise level sigma", title=f"by noise level (n = {settings['n_train']}; "
                                             "band: min-max over seeds)")
  right.set(xlabel="training points n", title=f"against n (sigma = {settings['n_sigma']})")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  _OUTPUTS.check()
  if _LATENT.value > _DIM.value:
    raise ConfigError(f"expected latent_dim <= dim (--latent_dim={_LATENT.value}, "
                      f"--dim={_DIM.value})")
  if _SIGMA_MIN.value > _SIGMA_MAX.value:
    raise ConfigError(f"expected sigma_min <= sigma_max (--sigma_min={_SIGMA_MIN.value}, "
                      f"--sigma_max={_SIGMA_MAX.value})")
  if _N_SIGMA.value not in [float(s) for s in _SIGMAS.value]:
    raise cli.flag_error(_N_SIGMA, "expected one of --sigmas")
  settings = {"dim": _DIM.value, "subspaces": _SUBSPACES.value, "latent_dim": _LATENT.value,
              "components": _COMPONENTS.value, "mean_scale": _MEAN_SCALE.value,
              "sigmas": _SIGMAS.value, "n_train": _N_TRAIN.value,
              "n_values": sorted({int(n) for n in _N_VALUES.value}),
              "seeds": _SEEDS.value, "steps": _STEPS.value, "batch_size": _BATCH.value,
              "learning_rate": _LR.value, "sigma_min": _SIGMA_MIN.value,
              "sigma_max": _SIGMA_MAX.value, "eval_samples": _EVAL.value,
              "models": _MODELS.value, "n_models": _N_MODELS.value}
  settings["n_sigma"] = next(s for s in _SIGMAS.value if float(s) == _N_SIGMA.value)
  start, runs = time.time(), {}
  wanted = ([(m, settings["n_train"]) for m in settings["models"]]
            + [(m, n) for n in settings["n_values"] for m in settings["n_models"]])
  for seed in range(settings["seeds"]):
    mix = sm.make_mixture(seed, settings["dim"], settings["subspaces"],
                          settings["latent_dim"], settings["components"],
                          mean_scale=settings["mean_scale"])
    pool = sm.sample(mix, max(settings["n_train"], *settings["n_values"]), 1000 + seed)
    for m, n in dict.fromkeys(wanted):
      runs[(m, seed, n)] = run_one(m, settings, mix, pool[:n], seed)
      print(f"seed {seed} {m} n={n}: {json.dumps(runs[(m, seed, n)])} "
            f"({time.time() - start:.0f}s)", flush=True)
  summary = summarise(runs, settings)
  text = "\n".join([tables(summary, settings), *paired_claims(runs, settings)])
  print(text)
  result = {"settings": settings, "runtime_s": round(time.time() - start, 1),
            "summary": summary, "runs": [{"model": m, "seed": s, "n": n, **r}
                                         for (m, s, n), r in runs.items()]}
  command = " ".join(["python -m experiments.molr_mog_study", *sys.argv[1:]])
  _OUTPUTS.write(result, f"# MoLR-MoG study\n\nCommand: `{command}` ({result['runtime_s']} s "
                 f"on CPU).\n\n{text}", lambda path: plot(summary, settings, path))


if __name__ == "__main__":
  cli.run(main)
