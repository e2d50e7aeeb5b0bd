"""Run a study: every (arm, level, draw) once, resumable, with its outputs in one directory.

    spec, scorer = prepare(config)    # every check, before any run
    check_output(spec, out)           # refuses another study's or other settings' results
    results = run(spec, scorer, out)  # results.json, results.md, results.png, provenance.json

Runs go draw by draw (every level and arm of draw 0 first), so a stopped study
has its early draws complete and paired. results.json is rewritten atomically
after every (level, draw) and holds only what determines the figures (the
study's settings, the runs in canonical order, the claims' statistics): a study
stopped and resumed writes the same bytes as one run straight through.
provenance.json lists every invocation: command, commit, machine, date, runs, seconds.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable

import ml_collections

from moejax.errors import ConfigError
from moejax.studies import report, scoring, spec as spec_lib

RESULTS, MARKDOWN, PLOT, PROVENANCE = (
  "results.json",
  "results.md",
  "results.png",
  "provenance.json",
)
OUTPUTS = (RESULTS, MARKDOWN, PLOT, PROVENANCE)


def prepare(config: ml_collections.ConfigDict) -> tuple[spec_lib.StudySpec, scoring.Scorer]:
  """The parsed study and its scorer; ConfigError for an unknown scorer, setting, arm
  setting, arm or metric, before anything runs."""
  first = spec_lib.load(config)
  scorer_class = scoring.get(first.scorer)
  bare = spec_lib.load(
    config, scorer_defaults=scorer_class.settings, arm_defaults=scorer_class.arm_settings
  )
  scorer = scorer_class(bare)
  metrics = tuple(scorer.metrics())
  spec = spec_lib.load(
    config,
    scorer_defaults=scorer_class.settings,
    arm_defaults=scorer_class.arm_settings,
    metrics=metrics,
  )
  scorer.spec = spec
  scorer.check()
  if spec.nested:
    scorer.models = [scorer.for_model(m) for m in range(len(spec.models))]
    for m, model in enumerate(scorer.models):
      try:
        model.check()
      except ConfigError as e:
        raise ConfigError(f"study.models[{m}] ({spec.model_label(m)}): {e}") from e
  return spec, scorer


def _first_difference(stored, current, key: str) -> str | None:
  """The dotted key where two JSON values first differ (None if equal)."""
  if isinstance(stored, dict) and isinstance(current, dict):
    for k in list(stored) + [k for k in current if k not in stored]:
      found = _first_difference(stored.get(k), current.get(k), f"{key}.{k}")
      if found:
        return found
    return None
  if isinstance(stored, list) and isinstance(current, list) and len(stored) == len(current):
    for i, (a, b) in enumerate(zip(stored, current)):
      found = _first_difference(a, b, f"{key}[{i}]")
      if found:
        return found
    return None
  return None if stored == current else key


def _lookup(value, key: str):
  for part in key.replace("]", "").replace("[", ".").split(".")[1:]:
    value = value[int(part)] if isinstance(value, list) else (value or {}).get(part)
  return value


def check_output(spec: spec_lib.StudySpec, out: str, *, make_parents: bool = False) -> dict | None:
  """The stored results to resume from (None: a new study); ConfigError if `out` is a
  file, holds something else, another study's results, or this study's with other
  settings, or (unless `make_parents`: the default location) its parent is missing."""
  where = f"(--out={out})"
  if not os.path.exists(out):
    parent = os.path.dirname(os.path.abspath(out))
    if not make_parents and not os.path.isdir(parent):
      raise ConfigError(f"output directory's parent {parent} does not exist {where}")
    return None
  if not os.path.isdir(out):
    raise ConfigError(f"output path is a file, not a directory {where}")
  path = os.path.join(out, RESULTS)
  if not os.path.exists(path):
    if set(os.listdir(out)) - set(OUTPUTS):
      raise ConfigError(
        f"output directory is not empty and holds no study results; use a new or empty one {where}"
      )
    return None
  try:
    with open(path) as f:
      stored = json.load(f)
    stored_spec = stored["study"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError(
      f"cannot resume: {path} is not a complete results file "
      f"({type(e).__name__}: {' '.join(str(e).split())[:80]}); start afresh "
      f"with --out elsewhere, or delete {path} {where}"
    ) from e
  if stored_spec.get("name") != spec.name:
    raise ConfigError(
      f"output directory holds the results of study "
      f"{stored_spec.get('name')!r}, not {spec.name!r}; use another {where}"
    )
  current = json.loads(json.dumps(spec.as_json()))
  key = _first_difference(stored_spec, current, "study")
  if key:
    raise ConfigError(
      f"cannot resume with different settings: {key} is "
      f"{json.dumps(_lookup(current, key))} here but "
      f"{json.dumps(_lookup(stored_spec, key))} in {path}; use another --out"
    )
  return stored


def planned(
  spec: spec_lib.StudySpec, scorer: scoring.Scorer
) -> list[tuple[int, int, dict, list[str]]]:
  """[(draw, model, level, [arm, ...])] in run order: draws outermost, then models."""
  return [
    (draw, model, level, [a for a in spec.arm_names if scorer.applies(a, level)])
    for draw in range(spec.draws)
    for model in range(len(spec.models))
    for level in spec.levels
  ]


def _write_atomic(path: str, text: str) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def results_json(
  spec: spec_lib.StudySpec, runs: list[dict], total: int, digests: list | None = None
) -> dict:
  return {
    "study": spec.as_json(),
    **({"model_digests": digests} if digests and any(digests) else {}),
    "total_runs": total,
    "runs": runs,
    "claims": report.claim_rows(spec, runs),
  }


def check_models(spec: spec_lib.StudySpec, digests: list, stored: dict | None) -> None:
  """ConfigError when a model of the study is not the one the stored runs were made
  on (its parameter digest differs, Scorer.model_digest), before anything runs."""
  before = (stored or {}).get("model_digests") or []
  for m, (old, new) in enumerate(zip(before, digests)):
    if old and new and old != new:
      raise ConfigError(
        f"cannot resume: study.models[{m}] ({spec.model_label(m)}) is not the model the "
        f"stored runs used (parameter digest {new[:12]} here, {old[:12]} stored); retrain "
        "it from the same seed and config, or use another --out"
      )


def _clean(arm: str, scores: dict, metrics: tuple[str, ...]) -> dict:
  unknown = sorted(set(scores) - set(metrics) - {scoring.PAIRING})
  if unknown:
    raise ValueError(
      f"scorer returned metric {unknown[0]!r} for arm {arm!r}, which it does "
      f"not declare ({', '.join(metrics)})"
    )
  out = {}
  for k in metrics:
    if k in scores:
      value = float(scores[k])
      out[k] = value if math.isfinite(value) else None
  return out


def provenance_entry(runs: int, seconds: float, *, stopped: bool) -> dict:
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    commit = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()
    if subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode:
      commit += " with uncommitted changes"
  except (OSError, subprocess.CalledProcessError):
    commit = "unknown"
  command = "python -m experiments.study " + " ".join(sys.argv[1:])
  machine = f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores"
  date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  return {
    "command": command,
    "commit": commit,
    "machine": machine,
    "date": date,
    "runs": runs,
    "seconds": round(seconds, 1),
    "stopped": stopped,
  }


def run(
  spec: spec_lib.StudySpec,
  scorer: scoring.Scorer,
  out: str,
  *,
  stored: dict | None = None,
  plot: bool = True,
  log: Callable[..., None] = print,
  save_every_s: float = 10.0,
) -> dict:
  """Run what `stored` (check_output's) lacks; the results. Progress is saved to
  results.json at most every `save_every_s` seconds (0: after every (level, draw))."""
  start = time.time()
  plan = planned(spec, scorer)
  total = sum(len(arms) for *_, arms in plan)
  order = {
    (arm, report.level_key(level), model, draw): i
    for i, (draw, model, level, arms) in enumerate(plan)
    for arm in arms
  }
  done = dict(report.index_runs((stored or {}).get("runs", [])))
  scorers = getattr(scorer, "models", None) or [scorer]
  digests = [s.model_digest() for s in scorers]
  check_models(spec, digests, stored)
  metrics = tuple(scorer.metrics())
  os.makedirs(out, exist_ok=True)
  history_path = os.path.join(out, PROVENANCE)
  history = json.load(open(history_path)) if os.path.exists(history_path) else []
  ran, saved = 0, time.time()

  def ordered():
    return sorted(
      done.values(), key=lambda r: (order[report.run_key(r)], spec.arm_names.index(r["arm"]))
    )

  def save():
    _write_atomic(
      os.path.join(out, RESULTS),
      json.dumps(results_json(spec, ordered(), total, digests), indent=1, allow_nan=False) + "\n",
    )

  try:
    for draw, model, level, arms in plan:
      key = report.level_key(level)
      pending = {a: spec.arm(a) for a in arms if (a, key, model, draw) not in done}
      if not pending:
        continue
      scores = scorers[model].score(level, draw, pending)
      missing = sorted(set(pending) - set(scores))
      if missing:
        raise ValueError(f"scorer {spec.scorer!r} returned no scores for arm {missing[0]!r}")
      for arm in pending:
        record = {
          "arm": arm,
          "level": level,
          **({"model": model} if spec.nested else {}),
          "draw": draw,
          "metrics": _clean(arm, scores[arm], metrics),
        }
        if scoring.PAIRING in scores[arm]:
          record[scoring.PAIRING] = str(scores[arm][scoring.PAIRING])
        done[(arm, key, model, draw)] = record
        ran += 1
      where = f"model {model} " if spec.nested else ""
      log(
        f"{where}draw {draw} {report.level_label(level)}: "
        + "; ".join(
          f"{a} "
          + ", ".join(
            f"{k}={v:.4g}"
            for k, v in done[(a, key, model, draw)]["metrics"].items()
            if v is not None
          )
          for a in pending
        )
      )
      if time.time() - saved >= save_every_s:
        save()
        saved = time.time()
  except BaseException:  # a stopped study keeps every finished run for the resume
    if ran:
      save()
      history.append(provenance_entry(ran, time.time() - start, stopped=True))
      _write_atomic(history_path, json.dumps(history, indent=1) + "\n")
    raise
  results = results_json(spec, ordered(), total, digests)
  _write_atomic(os.path.join(out, RESULTS), json.dumps(results, indent=1, allow_nan=False) + "\n")
  history.append(provenance_entry(ran, time.time() - start, stopped=False))
  _write_atomic(history_path, json.dumps(history, indent=1) + "\n")
  _write_atomic(
    os.path.join(out, MARKDOWN),
    report.markdown(spec, results, history, scorer.notes(results)) + "\n",
  )
  if plot and not scorer.plot(results, os.path.join(out, PLOT)):
    report.plot(spec, results["runs"], os.path.join(out, PLOT))
  return results
