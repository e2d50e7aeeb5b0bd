"""A study's statistics, markdown and default plot, from its runs (moejax/evaluation/stats).

Claims are tested at each level they match. For interval 't', the arm's values
are paired with the reference's by draw (only draws both have; a pairing digest
that differs within a draw is a StudyError); 'wilson' counts a 0/1 metric over
draws; 'bootstrap' resamples the arm's values over draws; 'slope' fits the
metric (minus the reference's, if any) against the transformed `over` axis for
each draw and takes the t-interval of the per-draw slopes (one draw: the
least-squares slope's own interval over the levels). In a study over several
models (`models`), the unit of every interval is a model: its value is the mean
over its draws (of the paired difference, the 0/1 metric's fraction excepted,
which Wilson pools over every model's draws), and each row keeps the interval
over all (model, draw) pairs beside it. p-values are Holm-adjusted
over every tested row of the study; a verdict whose interval excludes the null but
whose Holm-adjusted p is 0.05 or more is marked "(not after Holm)" in the table.
"""

from __future__ import annotations

import json
import math

import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies.scoring import PAIRING
from moejax.studies.spec import SOURCES, Claim, StudySpec


class StudyError(ConfigError):
  """The runs cannot be analysed as declared (e.g. arms paired on different draw data)."""


def level_key(level: dict) -> str:
  return json.dumps(level, sort_keys=True)


def level_label(level: dict) -> str:
  return ", ".join(f"{k}={v}" for k, v in level.items()) or "—"


def run_key(run: dict) -> tuple:
  return run["arm"], level_key(run["level"]), run.get("model", 0), run["draw"]


def index_runs(runs: list[dict]) -> dict:
  """{(arm, level key, model, draw): run}."""
  return {run_key(r): r for r in runs}


def units(spec: StudySpec) -> list:
  """The replicates in order: draws, or (model, draw) pairs in a study over models."""
  if spec.nested:
    return [(m, d) for m in range(len(spec.models)) for d in range(spec.draws)]
  return list(range(spec.draws))


def _unit_key(spec: StudySpec, unit) -> tuple[int, int]:
  return unit if spec.nested else (0, unit)


def values(spec: StudySpec, by_key: dict, arm: str, level: dict, metric: str) -> dict:
  """{unit: value} of `metric` for `arm` at `level` (finished runs only); a unit is a
  draw, or a (model, draw) pair in a study over models."""
  out = {}
  for unit in units(spec):
    run = by_key.get((arm, level_key(level), *_unit_key(spec, unit)))
    if run is not None and metric in run["metrics"]:
      out[unit] = run["metrics"][metric]
  return out


def paired(spec: StudySpec, by_key: dict, arm: str, reference: str, level: dict, metric: str):
  """(units, arm values, reference values) on the units both have, checked for pairing."""
  a, r = (values(spec, by_key, name, level, metric) for name in (arm, reference))
  common = sorted(set(a) & set(r))
  for unit in common:
    keys = {
      name: by_key[(name, level_key(level), *_unit_key(spec, unit))].get(PAIRING)
      for name in (arm, reference)
    }
    if None not in keys.values() and len(set(keys.values())) > 1:
      where = f"model {unit[0]}, draw {unit[1]}" if spec.nested else f"draw {unit}"
      raise StudyError(
        f"arms {arm!r} and {reference!r} were scored on different data at "
        f"{level_label(level)}, {where} (pairing {keys[arm]} vs "
        f"{keys[reference]}); they cannot be paired"
      )
  return common, [a[u] for u in common], [r[u] for u in common]


def model_means(spec: StudySpec, keys: list, data) -> np.ndarray:
  """Per model, the mean of `data` over its draws (units `keys`); `data` itself in a
  one-model study."""
  data = np.asarray(data, np.float64)
  if not spec.nested:
    return data
  models = sorted({model for model, _ in keys})
  return np.asarray([data[[k[0] == m for k in keys]].mean() for m in models])


TRANSFORM = {"identity": lambda x: x, "log": math.log, "log2": math.log2}


def claim_rows(spec: StudySpec, runs: list[dict]) -> list[dict]:
  """One row per (claim, level or slope group): interval, verdict, Holm-adjusted p."""
  by_key = index_runs(runs)
  rows = []
  for index, claim in enumerate(spec.claims):
    for level, (interval, over_draws) in _tested(spec, by_key, claim):
      row = {
        "claim": index,
        "text": claim.text,
        "arm": claim.arm,
        "reference": claim.reference,
        "metric": claim.metric,
        "level": level,
        "null": claim.null,
        "expect": claim.expect,
        "source": claim.source,
        "interval": interval.as_dict() if interval else None,
        "verdict": (
          stats.verdict(interval, claim.expect, null=claim.null) if interval else "not run yet"
        ),
      }
      if spec.nested:
        row["interval_over_draws"] = over_draws.as_dict() if over_draws else None
      rows.append(row)
  adjusted = stats.holm([r["interval"]["p"] if r["interval"] else None for r in rows])
  for row, p in zip(rows, adjusted):
    row["p_holm"] = p
    # a directional verdict whose test does not survive Holm's correction at 5%
    row["not_after_holm"] = (p is None or p >= 0.05) and row["verdict"].startswith(
      ("reproduces", "opposite", "differs")
    )
  return rows


def _tested(spec: StudySpec, by_key: dict, claim: Claim):
  """(level, (interval over the units, interval over every draw)) per tested level."""
  levels = [level for level in spec.levels if claim.matches(level)]
  if claim.interval == "slope":
    groups: dict[str, list[dict]] = {}
    for level in levels:
      rest = {k: v for k, v in level.items() if k != claim.over}
      groups.setdefault(level_key(rest), []).append(level)
    for group in groups.values():
      rest = {k: v for k, v in group[0].items() if k != claim.over}
      yield rest, _slope(spec, by_key, claim, group)
    return
  for level in levels:
    if claim.reference is not None:
      keys, a, r = paired(spec, by_key, claim.arm, claim.reference, level, claim.metric)
      data = np.asarray(a, np.float64) - np.asarray(r, np.float64)
    else:
      found = values(spec, by_key, claim.arm, level, claim.metric)
      keys, data = list(found), np.asarray(list(found.values()), np.float64)
    if data.size == 0:
      yield level, (None, None)
    elif claim.interval == "wilson":
      if not np.all((data == 0) | (data == 1)):
        raise StudyError(
          f"claim {claim.text!r}: interval 'wilson' needs a 0/1 metric, "
          f"{claim.metric} has other values"
        )
      pooled = stats.wilson(int(data.sum()), int(data.size), null=claim.null)
      yield level, (pooled, pooled)
    else:
      interval = stats.t_interval if claim.interval == "t" else stats.bootstrap_mean
      yield (
        level,
        (interval(model_means(spec, keys, data), null=claim.null), interval(data, null=claim.null)),
      )


def _slope(spec: StudySpec, by_key: dict, claim: Claim, group: list[dict]):
  x = np.asarray([TRANSFORM[claim.transform](level[claim.over]) for level in group])
  per_level = []
  for level in group:
    if claim.reference is not None:
      keys, a, r = paired(spec, by_key, claim.arm, claim.reference, level, claim.metric)
      per_level.append(dict(zip(keys, np.subtract(a, r))))
    else:
      per_level.append(values(spec, by_key, claim.arm, level, claim.metric))
  keys = sorted(set.intersection(*(set(v) for v in per_level)))
  if not keys or len(set(x)) < 2:
    return None, None
  y = np.asarray([[v[k] for v in per_level] for k in keys], np.float64)  # [units, levels]
  if len(keys) == 1:
    single = stats.slope(x, y[0], null=claim.null)
    return single, single
  centred = x - x.mean()
  slopes = (y - y.mean(1, keepdims=True)) @ centred / (centred @ centred)
  return (
    stats.t_interval(model_means(spec, keys, slopes), null=claim.null),
    stats.t_interval(slopes, null=claim.null),
  )


# ---- markdown --------------------------------------------------------------------------------


def _number(value: float) -> str:
  return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def interval_text(interval: dict | None, fmt: str = "{:+.4g}") -> str:
  if interval is None:
    return "—"
  return stats.format_interval(stats.Interval(**interval), fmt)


def claims_table(rows: list[dict], nested: bool = False) -> str:
  body = []
  for row in rows:
    against = f"− {row['reference']}" if row["reference"] else ""
    statistic = f"{row['arm']} {against} ({row['metric']})".replace("  ", " ")
    p = "—" if row["p_holm"] is None else f"{row['p_holm']:.2g}"
    source = "" if row["source"] == "paper" else f" ({SOURCES[row['source']]})"
    verdict = row["verdict"] + (" (not after Holm)" if row.get("not_after_holm") else "")
    over_draws = [interval_text(row.get("interval_over_draws"))] if nested else []
    body.append(
      [
        row["text"] + source,
        level_label(row["level"]),
        statistic,
        f"{row['null']:g}",
        interval_text(row["interval"]),
        *over_draws,
        p,
        verdict,
      ]
    )
  unit = (
    ["over models: mean ± std [95% CI]", "over all draws"] if nested else ["mean ± std [95% CI]"]
  )
  return stats.markdown_table(
    ["claim", "level", "statistic", "null", *unit, "p (Holm)", "verdict"], body
  )


def summary_table(spec: StudySpec, runs: list[dict], metric: str) -> str:
  """Per level and arm: mean ± std over draws, and the paired difference to the reference."""
  by_key = index_runs(runs)
  body = []
  for level in spec.levels:
    for arm in spec.arm_names:
      found = list(values(spec, by_key, arm, level, metric).values())
      if not found:
        continue
      spread = f" ± {_number(np.std(found, ddof=1))}" if len(found) > 1 else ""
      if arm == spec.reference:
        vs = "—"
      else:
        keys, a, r = paired(spec, by_key, arm, spec.reference, level, metric)
        vs = (
          stats.format_interval(
            stats.t_interval(model_means(spec, keys, np.subtract(a, r))), "{:+.4g}"
          )
          if keys
          else "—"
        )
      body.append([*level.values(), arm, len(found), f"{_number(np.mean(found))}{spread}", vs])
  over = " over models" if spec.nested else ""
  return stats.markdown_table(
    [
      *spec.axes,
      "arm",
      "runs" if spec.nested else "draws",
      f"{metric}: mean ± std",
      f"vs {spec.reference}{over}: mean ± std [95% CI]",
    ],
    body,
  )


def claimed_metrics(spec: StudySpec) -> list[str]:
  return list(dict.fromkeys(c.metric for c in spec.claims))


def unclaimed_summaries(spec: StudySpec, runs: list[dict], metrics, level: int = 2) -> str:
  """A summary_table under a heading for each of `metrics` that no claim tests (the
  claimed ones have theirs already)."""
  claimed = set(claimed_metrics(spec))
  return "\n\n".join(
    f"{'#' * level} {metric}\n\n{summary_table(spec, runs, metric)}"
    for metric in metrics
    if metric not in claimed
  )


def markdown(spec: StudySpec, results: dict, provenance: list[dict], notes: str = "") -> str:
  done, total = len(results["runs"]), results["total_runs"]
  lines = [f"# Study: {spec.name}", "", spec.description.strip(), ""]
  for entry in provenance[-3:]:
    lines.append(
      f"- `{entry['command']}` at commit {entry['commit']}, {entry['machine']}, "
      f"{entry['date']} ({entry['runs']} runs in {entry['seconds']:.0f} s)"
    )
  models = ""
  if spec.nested:
    models = (
      f" in each of {len(spec.models)} models ("
      + "; ".join(spec.model_label(m) for m in range(len(spec.models)))
      + "): intervals over the "
      "models' means, with the interval over all draws beside it"
    )
  lines += [
    "",
    f"{done} of {total} runs; {spec.draws} draws{models}; reference arm "
    f"{spec.reference}. Intervals are 95%; p-values Holm-adjusted over the table.",
    "",
    "## Claims",
    "",
    claims_table(results["claims"], spec.nested),
    "",
  ]
  for metric in claimed_metrics(spec):
    lines += [f"## {metric}", "", summary_table(spec, results["runs"], metric), ""]
  if notes:
    lines += [notes.strip(), ""]
  return "\n".join(lines)


def plot(spec: StudySpec, runs: list[dict], path: str) -> None:
  """Per claimed metric: each arm's mean over draws (± 95% t-interval) against the first
  numeric level axis (one line per arm and value of the other axes), else per level;
  a study of one level: one point per arm with its interval and its replicates."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  by_key = index_runs(runs)
  metrics = claimed_metrics(spec)[:4]
  numeric = [
    a for a in spec.axes if all(isinstance(level[a], (int, float)) for level in spec.levels)
  ]
  fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
  for ax, metric in zip(axes[0], metrics):
    if len(spec.levels) == 1:
      plot_arms(ax, spec, by_key, metric)
      continue
    x_axis = numeric[0] if numeric else None
    groups: dict[str, list[dict]] = {}
    for level in spec.levels:
      rest = {k: v for k, v in level.items() if k != x_axis}
      groups.setdefault(level_key(rest), []).append(level)
    for g, group in enumerate(groups.values()):
      for a, arm in enumerate(spec.arm_names):
        xs, means, lows, highs = [], [], [], []
        for i, level in enumerate(group):
          found = list(values(spec, by_key, arm, level, metric).values())
          if not found:
            continue
          interval = stats.t_interval(found)
          xs.append(level[x_axis] if x_axis else i)
          means.append(interval.mean)
          lows.append(interval.lo if interval.lo is not None else interval.mean)
          highs.append(interval.hi if interval.hi is not None else interval.mean)
        if not xs:
          continue
        rest = {k: v for k, v in group[0].items() if k != x_axis}
        label = arm + (f" ({level_label(rest)})" if len(groups) > 1 else "")
        ax.plot(xs, means, "-o", color=f"C{a % 10}", alpha=1 - 0.5 * g / len(groups), label=label)
        ax.fill_between(xs, lows, highs, color=f"C{a % 10}", alpha=0.15)
    ax.set(xlabel=x_axis or "level", ylabel=metric, title=metric)
    if x_axis and all(level[x_axis] > 0 for level in spec.levels):
      values_x = sorted({level[x_axis] for level in spec.levels})
      if values_x[-1] / values_x[0] >= 50:
        ax.set_xscale("log")
    ax.legend(fontsize=7)
  replicates = f"{spec.draws} draws" + (f" x {len(spec.models)} models" if spec.nested else "")
  fig.suptitle(f"{spec.name}: mean over {replicates}, 95% t-interval")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_arms(ax, spec: StudySpec, by_key: dict, metric: str) -> None:
  """One level's `metric`: per arm its mean and 95% t-interval, and every replicate."""
  level = spec.levels[0]
  for a, arm in enumerate(spec.arm_names):
    found = list(values(spec, by_key, arm, level, metric).values())
    if not found:
      continue
    interval = stats.t_interval(found)
    low = interval.lo if interval.lo is not None else interval.mean
    high = interval.hi if interval.hi is not None else interval.mean
    color = f"C{a % 10}"
    error = [[interval.mean - low], [high - interval.mean]]
    ax.errorbar(a, interval.mean, error, fmt="o", color=color, capsize=4)
    ax.scatter([a + 0.15] * len(found), found, s=10, color=color, alpha=0.5)
  names = spec.arm_names
  ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
  ax.set(ylabel=metric, title=metric)
