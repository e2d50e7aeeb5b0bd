"""Expert pruning studies (moejax/posttrain/prune.py): every method at every keep
level on several calibration draws, each pruned model scored on the same held-out
bytes of the source's eval split (moejax/posttrain/measure.py).

Arms: `method`, a pruning method (moejax/posttrain/methods.py: SCHUR-A*, greedy,
Step, the rankings, HEAPr and the atom baselines) or 'none', the unpruned model;
`merge` and `partner` (prune.MERGES, prune.PARTNERS: how pruned experts merge into
kept ones), `rescale` (fold the rescaled objective's least-squares weights into
the kept experts) and `normalisation` (HEAPr's per-expert scaling,
atoms.NORMALISATIONS).
Levels: `keep`, a string: a fraction of each layer's experts ('0.5'), a count
('9'), 'knee' (each layer's budget at the knee of err(m)), or for an atom method
the fraction of all atoms. Draw d: the calibration windows drawn with seed d from
the training split (measure.Bench.calibration), whose statistics every method of
the draw shares (their digest is the runs' pairing key), and seed d of the random
methods. The unpruned model does not depend on the draw: it is scored once and
paired with every draw.

Metrics: bpb (all) and bpb/<domain>, probe/<name> accuracies, parameter_bytes (what
the saved model stores; an atom method keeps zero padding), expert_parameters (the
routed-expert parameters that can contribute) and kept_experts (over all MoE
layers; expert methods and the unpruned model).

`SourceScorer` is the part the compression scorer shares: the source workdir, its
Bench, the metric names, settings checks and the per-metric tables in the notes.

Also per pruned model, as means over its MoE layers: proxy_error, err(S) / ||Y||^2
of the selection objective (dropped experts' outputs vanish, the rest keep their
gates; expert methods), and layer_error, the deployed layer's own error on the
calibration tokens (re-routed, renormalised, rescaled or merged as deployed) over
the same ||Y||^2 (prune.prune_model, contributions.deployed_errors).
"""

from __future__ import annotations

import functools

import numpy as np

from moejax.errors import ConfigError
from moejax.posttrain import measure
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

NONE = "none"  # the arm of the unmodified model


class SourceScorer(Scorer):
  """A study of models made from one training workdir (study.settings.workdir)."""

  settings = {
    "workdir": "runs/zoo/s",
    "num_windows": 64,
    "bytes_per_domain": 8192,
    "probes": "auto",
    "probe_count": 16,
  }
  WORKDIR = "study.settings.workdir"

  @functools.cached_property
  def source_config(self):
    """The workdir's run config (metadata only); ConfigError naming the setting."""
    from moejax.posttrain import source

    return source.training_config(self.settings["workdir"], self.WORKDIR)[0]

  @functools.cached_property
  def bench(self) -> measure.Bench:
    s = self.settings
    return measure.Bench(
      s["workdir"],
      num_windows=s["num_windows"],
      bytes_per_domain=s["bytes_per_domain"],
      probes=self.probes,
      probe_count=s["probe_count"],
      reroute_windows=s.get("reroute_windows", 0),
      key=self.WORKDIR,
    )

  @property
  def probes(self) -> tuple[str, ...]:
    return measure.probes_of(self.settings["probes"], self.source_config.data)

  def metrics(self):
    if not isinstance(self.settings["workdir"], str):
      raise ConfigError(f"{self.WORKDIR}={self.settings['workdir']!r} must be a path")
    if not isinstance(self.settings["probes"], str):
      raise ConfigError(
        f"study.settings.probes={self.settings['probes']!r} must be 'auto', "
        "'' or comma-separated probe names"
      )
    data = self.source_config.data
    return measure.metric_names(measure.domains_of(data), self.probes) + self.extra_metrics()

  def extra_metrics(self) -> tuple[str, ...]:
    """The study's metrics beside bpb and the probes."""
    return ()

  def check(self) -> None:
    from moejax.evaluation.probe_data import PROBES

    self.check_integers({"num_windows": 1, "bytes_per_domain": 0, "probe_count": 1})
    unknown = [p for p in self.probes if p not in PROBES]
    if unknown:
      raise ConfigError(
        f"study.settings.probes={self.settings['probes']!r}: {unknown[0]!r} "
        f"is not a probe; valid: {', '.join(sorted(PROBES))}"
      )

  def check_levels(self, axes: tuple[str, ...], kind) -> str:
    """The levels' one axis (one of `axes`); ConfigError unless every value is a `kind`."""
    axis = self.spec.axes
    if len(axis) != 1 or axis[0] not in axes:
      raise ConfigError(
        f"study.levels={list(self.spec.levels)!r} must give one axis, {' or '.join(axes)}"
      )
    for j, level in enumerate(self.spec.levels):
      value = level[axis[0]]
      if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(
          f"study.levels[{j}].{axis[0]}={value!r} must be a {getattr(kind, '__name__', 'number')}"
        )
    return axis[0]

  def context_keys(self) -> dict:
    return {"num_windows": "study.settings.num_windows", "context": "data.seq_len"}

  @functools.cached_property
  def where(self) -> str:
    return f"{self.WORKDIR}={self.settings['workdir']}"

  def notes(self, results: dict) -> str:
    """A table per metric no claim shows (per-domain bpb, probes, sizes)."""
    shown = set(report.claimed_metrics(self.spec))
    parts = []
    for metric in self.metrics():
      if metric not in shown and any(metric in r["metrics"] for r in results["runs"]):
        parts.append(f"## {metric}\n\n{report.summary_table(self.spec, results['runs'], metric)}")
    return "\n\n".join(parts)


@SCORERS.register("pruning")
class Pruning(SourceScorer):
  settings = {**SourceScorer.settings, "objective": "rescaled"}
  arm_settings = {
    "method": NONE,
    "merge": "",
    "partner": "output",
    "rescale": False,
    "normalisation": "routed",
  }

  def extra_metrics(self):
    return ("parameter_bytes", "expert_parameters", "kept_experts", "proxy_error", "layer_error")

  @staticmethod
  def request(arm: dict, keep: str, objective: str):
    from moejax.posttrain.prune import Pruning as Request

    return Request(
      arm["method"],
      keep,
      objective,
      bool(arm["rescale"]),
      0,
      arm["merge"],
      arm["partner"],
      arm["normalisation"],
    )

  def check(self) -> None:
    from moejax.posttrain.prune import check_options
    from moejax.posttrain.request import check_request

    super().check()
    self.check_levels(("keep",), str)
    m = self.source_config.model
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["method"] == NONE:
        continue
      for j, level in enumerate(self.spec.levels):
        keys = {
          "method": f"study.arms[{i}].method",
          "keep": f"study.levels[{j}].keep",
          "objective": "study.settings.objective",
          **self.context_keys(),
          **{k: f"study.arms[{i}].{k}" for k in ("merge", "partner", "rescale", "normalisation")},
        }
        request = self.request(arm, level["keep"], self.settings["objective"])
        check_request(
          m,
          request,
          num_windows=self.settings["num_windows"],
          context=self.source_config.data.seq_len,
          source=self.where,
          keys=keys,
        )
        check_options(request, keys)

  @functools.cached_property
  def unpruned(self) -> dict:
    from moejax.models.structure import expert_counts

    source = self.bench.source
    return {
      **self.bench.evaluate(source.model, source.params, source.rest),
      **self._sizes(source.params),
      "kept_experts": sum(expert_counts(source.model)),
      "proxy_error": 0.0,
      "layer_error": 0.0,
    }

  @staticmethod
  def _sizes(params) -> dict:
    return {
      "parameter_bytes": measure.parameter_bytes(params),
      "expert_parameters": measure.expert_parameters(params),
    }

  def score(self, level, draw, arms):
    from moejax.posttrain import prune

    bench = self.bench
    calibration = bench.calibration(draw)
    pairing = digest(calibration.windows)
    out = {}
    for name, arm in arms.items():
      if arm["method"] == NONE:
        out[name] = {**self.unpruned, PAIRING: pairing}
        continue
      m, params, rest, layers = prune.prune_model(
        bench.model,
        bench.source.params,
        bench.source.rest,
        keep=level["keep"],
        method=arm["method"],
        objective=self.settings["objective"],
        seed=draw,
        calibration=calibration,
        rescale=bool(arm["rescale"]),
        merge=arm["merge"],
        partner=arm["partner"],
        normalisation=arm["normalisation"],
        deployed=True,
      )
      scores = {
        **bench.evaluate(m, params, rest),
        **self._sizes(params),
        PAIRING: pairing,
        "layer_error": float(np.mean([layer["deployed_error"] for layer in layers])),
      }
      if all("kept" in layer for layer in layers):
        scores["kept_experts"] = sum(len(layer["kept"]) for layer in layers)
        scores["proxy_error"] = float(np.mean([layer["relative_error"] for layer in layers]))
      out[name] = scores
    return out
