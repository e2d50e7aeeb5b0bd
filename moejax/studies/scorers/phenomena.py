"""Super experts (Su et al. 2025, arXiv 2507.23279): ablating the super experts of a
trained MoE LM against ablating as many random and as many most-frequently routed
experts (moejax/analysis/super_experts.py, moejax/analysis/phenomena.py).

Draw d reads block d of the held-out split: the bytes [d N, (d + 1) N) of every domain,
N = settings.bytes_per_domain, cut into windows of settings.context tokens (0: the
training seq_len). On those windows the unablated model is profiled (a_{l,e}, massive
activations, attention sinks, routing counts) and the super experts are named by
settings.rule: "official" (the official profiler's: the first include_layers of the
blocks, P_quantile and max // (1 / fraction_of_max) over them) or "massive_layers"
(ours: min_ratio, growth; super_experts.select); then each arm
ablates its experts (zeroes their down projection, the router untouched):
  none            nothing (the reference)
  super_experts   the super experts; where the rule names none, the n experts of
                  largest a (super_expert_ablation.ablation_arms' `top_a`)
  most_frequent   the n experts the router sends most slots to on the draw's windows
  random          n experts drawn uniformly with numpy default_rng(d)
n = settings.n, or 0: the number of super experts, 1 when none. Metrics: the harness's
bits per byte on the block's documents, the mean next-token loss on its windows
(nats), the attention mass on position 0 (mean over layers), the residual stream's
max |h|, super_experts_found (how many the rule names on the draw, every arm), and the
accuracy of each of settings.probes ('auto': every probe, arithmetic included, for a mix
model; probe_count examples per group drawn with seed d).
A draw's profile is computed once, on its first request, and shared by its arms.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies.scoring import SCORERS, Scorer, digest

KINDS = ("none", "super_experts", "most_frequent", "random")


@SCORERS.register("phenomena_ablation")
class PhenomenaAblation(Scorer):
  settings = {
    "workdir": "runs/zoo/s",
    "bytes_per_domain": 4096,
    "context": 0,
    "n": 0,
    "rule": "official",
    "quantile": 99.5,
    "fraction_of_max": 0.1,
    "include_layers": 0.75,
    "min_ratio": 100.0,
    "growth": 2.0,
    "batch_rows": 32,
    "probes": "auto",
    "probe_count": 32,
  }
  CRITERION = ("rule", "quantile", "fraction_of_max", "include_layers", "min_ratio", "growth")
  arm_settings = {"ablate": "none"}

  def metrics(self):
    return (
      "bpb",
      "loss_nats",
      "mean_mass_on_position_0",
      "max_residual",
      "super_experts_found",
      *(f"probe/{p}" for p in self.probes),
    )

  @property
  def probes(self) -> tuple[str, ...]:
    """settings.probes as names ('auto': every probe for a mix model, else none)."""
    from moejax.posttrain.measure import probes_of

    if not isinstance(self.settings["probes"], str):
      raise ConfigError(
        f"study.settings.probes={self.settings['probes']!r} must be 'auto', "
        "'' or comma-separated probe names"
      )
    from moejax.evaluation.probe_data import PROBES

    names = probes_of(self.settings["probes"], self.held_out.config.data)
    unknown = [p for p in names if p not in PROBES]
    if unknown:
      raise ConfigError(
        f"study.settings.probes={self.settings['probes']!r}: {unknown[0]!r} "
        f"is not a probe; valid: {', '.join(sorted(PROBES))}"
      )
    return names

  def check(self):
    s = self.settings
    from moejax.analysis.super_experts import RULES

    if s["rule"] not in RULES:
      raise ConfigError(f"study.settings.rule={s['rule']!r} must be one of {', '.join(RULES)}")
    for key, low in (
      ("bytes_per_domain", 1),
      ("context", 0),
      ("n", 0),
      ("batch_rows", 1),
      ("probe_count", 1),
    ):
      if not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < low:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be an integer >= {low}")
    for key, low, high in (
      ("quantile", 0, 100),
      ("fraction_of_max", 0, 1),
      ("include_layers", 0, 1),
    ):
      if not low < s[key] <= high and not (key == "quantile" and s[key] == 0):
        raise ConfigError(
          f"study.settings.{key}={s[key]!r} must be in "
          f"{'[' if key == 'quantile' else '('}{low}, {high}]"
        )
    for key in ("min_ratio", "growth"):
      if not s[key] >= 0:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be >= 0")
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["ablate"] not in KINDS:
        raise ConfigError(
          f"study.arms[{i}].ablate={arm['ablate']!r} (arm {name!r}) must be "
          f"one of {', '.join(KINDS)}"
        )
    if self.spec.axes:
      raise ConfigError(f"study.levels have axes {self.spec.axes}; this scorer has none")
    from moejax.models.structure import expert_counts

    if s["n"] > sum(expert_counts(self.held_out.config.model)):
      raise ConfigError(
        f"study.settings.n={s['n']} must be at most the model's "
        f"{sum(expert_counts(self.held_out.config.model))} experts"
      )
    for draw in range(self.spec.draws):
      self.held_out.windows(
        draw,
        s["bytes_per_domain"],
        f"(study.settings.context="
        f"{s['context']}, bytes_per_domain={s['bytes_per_domain']}, "
        f"draw {draw})",
      )

  @functools.cached_property
  def held_out(self):
    from moejax.analysis.phenomena import HeldOut

    return HeldOut.of_study(self.settings)

  @functools.cached_property
  def model(self):
    from moejax.analysis.super_experts import model_of

    h = self.held_out
    return model_of((h.config, h.params, h.rest))

  @functools.cache
  def profile(self, draw: int) -> dict:
    """The draw's documents, windows, measured parts, profile and arms' experts."""
    from moejax.analysis import super_expert_ablation as ablation
    from moejax.analysis import super_experts as se

    m, graphdef, params, rest = self.model
    documents, windows, _ = self.held_out.windows(draw, self.settings["bytes_per_domain"])
    tokens = jnp.asarray(windows, jnp.int32)
    found = jax.device_get(se.measure(graphdef, params, rest, tokens, se.PARTS + ("counts",)))
    criterion = {k: self.settings[k] for k in self.CRITERION}
    report = se.profile_report(m, tokens.shape, found, **criterion)
    n, arms = ablation.ablation_arms(
      report, found["peaks"], found["counts"], self.settings["n"] or None, seeds=(draw,)
    )
    return {
      "documents": documents,
      "tokens": tokens,
      "found": found,
      "report": report,
      "n": n,
      "arms": dict(zip(KINDS, arms)),
      "digest": digest(windows),
    }

  def score(self, level, draw, arms):
    from moejax.analysis import super_expert_ablation as ablation

    m, graphdef, params, rest = self.model
    p, out = self.profile(draw), {}
    for name, arm in arms.items():
      _, pairs = p["arms"][arm["ablate"]]
      effect = ablation.ablation_effect(
        m,
        graphdef,
        params,
        rest,
        p["tokens"],
        p["found"],
        pairs,
        score=functools.partial(
          self.held_out.bpb,
          p["documents"],
          probes=self.probes,
          probe_count=self.settings["probe_count"],
          seed=draw,
        ),
        batch_rows=self.settings["batch_rows"],
      )
      out[name] = {
        "bpb": effect["bpb"]["all"],
        "loss_nats": effect["loss_nats"],
        "mean_mass_on_position_0": effect["mean_mass_on_position_0"],
        "max_residual": effect["max_residual"],
        "super_experts_found": len(p["report"]["super_experts"]),
        **{f"probe/{k}": v for k, v in effect["probes"].items()},
        "pairing": p["digest"],
      }
    return out

  def notes(self, results):
    rows = []
    for draw in range(self.spec.draws):
      p = self.profile(draw)
      report = p["report"]
      ratio = max(layer["ratio"] for layer in report["massive_activations"]["layers"])

      def experts(kind, p=p):
        return ", ".join(f"{j}:{e}" for j, e in p["arms"][kind][1]) or "—"

      rows.append(
        [
          draw,
          f"{p['tokens'].shape[0]} x {p['tokens'].shape[1]}",
          p["arms"]["super_experts"][0],
          experts("super_experts"),
          experts("most_frequent"),
          experts("random"),
          report["massive_activations"]["massive_layers"] or "none",
          f"{ratio:.1f}",
          f"{min(report['attention_sinks']['mass_on_position_0']):.3f}-"
          f"{max(report['attention_sinks']['mass_on_position_0']):.3f}",
          f"{report['attention_sinks']['uniform_baseline']:.3f}",
        ]
      )
    return (
      "### Per draw: the profile and the ablated experts (MoE layer:expert)\n\n"
      + stats.markdown_table(
        [
          "draw",
          "windows",
          "SE arm",
          "super_experts arm",
          "most_frequent",
          "random",
          "massive layers",
          "max residual max/median",
          "mass on position 0",
          "uniform",
        ],
        rows,
      )
    )
