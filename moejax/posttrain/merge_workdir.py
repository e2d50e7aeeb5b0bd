"""Merging whole models read from disk (moejax/merging/ merges their parameter
trees), written as a workdir the project loads.

  models: a training workdir (its latest checkpoint), a converted workdir or an HF
  checkpoint directory each (moejax/posttrain/source.py reads them)
  output: what the base is, as posttrain/prune_workdir.py writes a pruned model: a
  training workdir holding one checkpoint at the base's step (its config, router
  state and data position; experiments.train continues it), else a converted
  workdir (the base's tokenizer files copied); plus merge.json, what was merged.

Only trained parameters are merged; non-trained state (`rest`: router biases and
counters) is the base's (for average, which reads no base, the first model's).
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from moejax import cli_files
from moejax.errors import ConfigError
from moejax.merging.base import Merge, check_weights, uniform
from moejax.posttrain import source
from moejax.posttrain.source import save_training_workdir

REPORT = "merge.json"


def source_kind(path: str, key: str) -> str:
  """'training', 'converted', 'mixed' or 'hf' (a directory with config.json and no
  workdir markers); ConfigError naming `key=path` for anything else."""
  if cli_files.workdir_kind(path) == "foreign" and os.path.isfile(
    os.path.join(path, "config.json")
  ):
    return "hf"
  return cli_files.checked_workdir(key, path)


def check_inputs(
  merge: Merge, base: str | None, experts: list[str], weights, out: str | None
) -> dict:
  """Every refusal that needs no model loaded: a base where the method needs one, each
  input's kind, the weights' count and values, and `out` (new or empty, not inside an
  input). {key: kind}."""
  if not experts:
    raise ConfigError("give at least one model to merge (--experts=)")
  if merge.method.needs_base and base is None:
    raise ConfigError(
      f"--method={merge.method.name} takes task vectors from a base model: "
      "give --base (--base=None)"
    )
  kinds = {} if base is None else {"--base": source_kind(base, "--base")}
  for i, path in enumerate(experts):
    kinds[f"--experts[{i}]"] = source_kind(path, "--experts")
  if weights is not None:
    check_weights(weights, len(experts))
  inputs = ([("--base", base)] if base else []) + [("--experts", p) for p in experts]
  cli_files.output_dir("out", out, empty=True, not_inside=inputs)
  return kinds


def load(path: str, kind: str):
  loaded = source.load(hf_dir=path) if kind == "hf" else source.load(workdir=path)
  loaded.params = jax.tree.map(np.asarray, loaded.params)
  return loaded


def merge_models(
  merge: Merge, base: str | None, experts: list[str], weights=None, out: str | None = None
) -> dict:
  """Merge the models at `experts` (onto `base`) with `merge`; write `out` if given;
  the report (what was merged, the weights and settings)."""
  kinds = check_inputs(merge, base, experts, weights, out)
  sources = [load(p, kinds[f"--experts[{i}]"]) for i, p in enumerate(experts)]
  first = load(base, kinds["--base"]) if base else sources[0]
  names = ([f"--base={base}"] if base else []) + [
    f"--experts[{i}]={p}" for i, p in enumerate(experts)
  ]
  merged = merge(
    first.params if base else None,
    [s.params for s in sources],
    None if weights is None else np.asarray(weights, np.float64),
    names=names if base else ["base"] + names,
  )
  used = uniform(len(experts)) if weights is None else np.asarray(weights, np.float64)
  report = {
    "method": merge.method.name,
    "settings": merge.settings,
    "base": base,
    "experts": list(experts),
    "weights": [float(w) for w in used],
  }
  if out:
    write(out, first, merged, base or experts[0])
    with open(os.path.join(out, REPORT), "w") as f:
      json.dump(report, f, indent=1)
  return report


def write(out: str, model: source.Source, params: dict, path: str) -> None:
  """`params` with the rest of `model` (read from `path`) as a workdir at `out`."""
  if model.kind == "training":
    config, step = model.training_run()
    save_training_workdir(out, config, params, model.rest, step, model.data_state)
    return
  from moejax.interop.convert import Loaded, save_workdir

  files = path if model.kind == "hf" else os.path.join(path, "model")
  save_workdir(out, Loaded(model.model, params, model.rest, model.hf_config), files)
