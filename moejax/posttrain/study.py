"""A pruning study on a trained workdir (issue 14): every method at every keep
level on several calibration draws, scored by the evaluation harness on the
same held-out bytes, with paired intervals over the draws.

For draw d, calibration windows are drawn with seed d (prune.calibration_windows)
and their statistics are shared by every method. Each pruned model is scored
per domain (bits per byte), on the probes, and by its parameter bytes. For a
method and keep level, delta_d = bpb(method, d) - bpb(reference, d), reported as
mean, std and 95% t-interval over the draws (train/seed_stats.paired_difference)
against the reference method (routing frequency by default) and against the
unpruned model.
"""
from __future__ import annotations

import numpy as np

from moejax.posttrain import prune
from moejax.train import seed_stats


def parameter_bytes(params) -> int:
  import jax
  return int(sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(params)))


def expert_parameters(params) -> int:
  """Routed-expert parameters that can contribute: w_gate, w_up and w_down entries
  of every atom (hidden unit) whose w_down row is not all zero (an atom method's
  removed atoms are zero padding, posttrain/atoms.py)."""
  total = 0
  for block in params["blocks"].values():
    experts = block.get("ffn", {}).get("experts") if isinstance(block, dict) else None
    if not experts or "w_down" not in experts:
      continue
    w_down = np.asarray(experts["w_down"])  # [E, F, d]
    live = np.any(w_down != 0, axis=-1)
    total += int(live.sum()) * (2 * np.asarray(experts["w_gate"]).shape[1] + w_down.shape[2])
  return total


def run_study(workdir: str, *, methods, keeps, draws: int, num_windows: int,
              bytes_per_domain: int, probes=(), probe_count: int = 32,
              objective: str = "rescaled", reference: str = "frequency", log=print,
              on_run=None) -> dict:
  """{settings, unpruned: scores, runs: [{keep, method, draw, scores, layers}]} (module
  doc); on_run(partial result) after every run (to save progress)."""
  from moejax.config import expert_counts
  from moejax.data.pipeline import split_documents, train_token_stream
  from moejax.evaluation import harness
  from moejax.evaluation.model import DecoderLM
  from moejax.train.restore import load_from_workdir
  config, step = prune.source_config(workdir)
  context = config.data.seq_len
  for keep in keeps:
    for method in methods:
      prune.check_request(config.model, keep, method, objective, False, num_windows, context,
                          f"--workdir={workdir}")
  source = prune.load_source(workdir, config, step)
  tokenizer = load_from_workdir(workdir, for_generation=True)[4]
  documents = harness.sample_documents(split_documents(config.data), bytes_per_domain)
  settings = harness.Settings(context=context, probes=tuple(probes), probe_count=probe_count)
  stream = train_token_stream(config.data)

  def result(runs):
    return {"workdir": workdir, "step": step, "methods": list(methods), "keeps": list(keeps),
            "draws": draws, "num_windows": num_windows, "context": context,
            "bytes_per_domain": bytes_per_domain, "objective": objective,
            "reference": reference, "unpruned": unpruned, "runs": runs}

  def score(m, params, rest):
    evaluation = harness.evaluate(DecoderLM(m, params, rest), tokenizer, tokenizer.eos_id,
                                  documents, settings, expert_counts(m))
    return {"bpb": evaluation.report["bpb"], "probes": evaluation.report["probes"],
            "parameter_bytes": parameter_bytes(params),
            "expert_parameters": expert_parameters(params)}

  unpruned = score(config.model, source.params, source.rest)
  log(f"unpruned: {unpruned['bpb']['all']:.4f} bpb")
  runs = []
  for draw in range(draws):
    windows = prune.calibration_windows(stream, num_windows, context, seed=draw)
    calibration = prune.Calibration(config.model, source.params, source.rest, windows)
    for keep in keeps:
      for method in methods:
        m, params, rest, layers = prune.prune_model(
            config.model, source.params, source.rest, keep=keep, method=method,
            objective=objective, seed=draw, calibration=calibration)
        runs.append({"keep": keep, "method": method, "draw": draw,
                     "scores": score(m, params, rest), "layers": layers})
        log(f"keep {keep} {method} draw {draw}: {runs[-1]['scores']['bpb']['all']:.4f} bpb")
        if on_run:
          on_run(result(runs))
  return result(runs)


def format_interval(diff) -> str:
  if diff.lo is None:
    return f"{diff.mean:+.4f}"
  return f"{diff.mean:+.4f} ± {diff.std:.4f} [{diff.lo:+.4f}, {diff.hi:+.4f}]"


PRUNING_COLUMNS = (
    ("parameter bytes", lambda scores: f"{scores['parameter_bytes']:,}"),
    ("expert parameters", lambda scores: f"{scores.get('expert_parameters', 0):,}"))


def summary_table(study: dict, domain: str = "all", *, levels: str = "keeps",
                  base: str = "unpruned", level_label: str = "keep",
                  columns=PRUNING_COLUMNS) -> str:
  """Markdown: per level and method, mean bpb over draws, the paired difference to
  the reference method and to the `base` model (study[base]: its scores), probes,
  then `columns` ((header, scores -> text) of each level's first draw; pruning:
  stored parameter bytes and the expert parameters that can contribute)."""
  runs, ref = study["runs"], study["reference"]
  base_scores = study[base]
  probe_names = sorted(base_scores["probes"])
  lines = [f"| {level_label} | method | bpb ({domain}) | vs {ref} | vs {base} | "
           + "".join(f"{p} | " for p in probe_names)
           + "".join(f"{header} | " for header, _ in columns),
           "|---|---|---|---|---|" + "---|" * (len(probe_names) + len(columns))]
  lines.append(f"| all | {base} | {base_scores['bpb'][domain]:.4f} | — | — | "
               + "".join(f"{_probe(base_scores, p):.3f} | " for p in probe_names)
               + "".join(f"{_column(cell, base_scores)} | " for _, cell in columns))
  for level in study[levels]:
    by_method = {m: level_runs(runs, level, m) for m in study["methods"]}
    reference = [r["scores"]["bpb"][domain] for r in by_method.get(ref, [])]
    for method, rows in by_method.items():
      if not rows:
        continue
      values = [r["scores"]["bpb"][domain] for r in rows]
      vs_ref = ("—" if method == ref or len(reference) != len(values)
                else format_interval(seed_stats.paired_difference(values, reference)))
      vs_base = format_interval(seed_stats.paired_difference(
          values, [base_scores["bpb"][domain]] * len(values)))
      lines.append(f"| {level} | {method} | {np.mean(values):.4f} | {vs_ref} | {vs_base} | "
                   + "".join(f"{np.mean([_probe(r['scores'], p) for r in rows]):.3f} | "
                             for p in probe_names)
                   + "".join(f"{_column(cell, rows[0]['scores'])} | " for _, cell in columns))
  return "\n".join(lines)


def _column(cell, scores) -> str:
  try:
    return cell(scores)
  except (KeyError, TypeError):
    return "—"


def level_runs(runs, level, method) -> list:
  """The runs of one level and method, by draw (pruning runs name the level 'keep')."""
  return sorted((r for r in runs if r.get("level", r.get("keep")) == level
                 and r["method"] == method), key=lambda r: r["draw"])


# The papers' claims the study can test on held-out bpb: (method, against, the
# direction the paper expects of bpb(method) - bpb(against), the claim).
CLAIMS = (
    ("schur_astar", "frequency", "lower", "SCHUR-A*: the optimal subset beats routing frequency"),
    ("schur_astar", "greedy", "lower", "SCHUR-A*: the optimal subset beats greedy selection"),
    ("schur_astar", "output_norm", "lower", "SCHUR-A*: beats ranking by output energy"),
    ("step", "frequency", "lower", "Step (scores + merge) beats routing frequency"),
    ("step_no_merge", "frequency", "lower", "Step's scores alone beat routing frequency"),
    ("heapr", "schur_astar", "lower",
     "HEAPr: atoms beat whole experts at equal expert parameters"),
    ("heapr", "heapr_first_order", None, "HEAPr's score against our first-order variant"),
)


def claims_table(study: dict, claims=CLAIMS, domain: str = "all", *, levels: str = "keeps",
                 level_label: str = "keep", metric=None) -> str:
  """Markdown: per level and claim with both methods in the study, the paired
  difference over draws, mean ± std [95% interval], and seed_stats.verdict
  ('reproduces' only when the interval excludes 0 in the paper's direction).
  metric(scores) -> the value compared (default the bpb on `domain`)."""
  header = "bpb difference" if metric is None else "difference"
  metric = metric or (lambda scores: scores["bpb"][domain])
  lines = [f"| {level_label} | claim | method - against | {header} | verdict |",
           "|---|---|---|---|---|"]
  for keep in study[levels]:
    for method, against, direction, claim in claims:
      values = [[metric(r["scores"]) for r in level_runs(study["runs"], keep, name)]
                for name in (method, against)]
      if not all(values) or len(values[0]) != len(values[1]):
        continue
      diff = seed_stats.paired_difference(*values)
      lines.append(f"| {keep} | {claim} | {method} - {against} | {format_interval(diff)} | "
                   f"{seed_stats.verdict(diff, direction, '{:.4f}')} |")
  return "\n".join(lines)


def _probe(scores: dict, name: str) -> float:
  """A probe's accuracy over all its examples (nan when it has none)."""
  accuracy = scores["probes"][name]["all"]["accuracy"]
  return float("nan") if accuracy is None else accuracy
