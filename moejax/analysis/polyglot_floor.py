"""A polyglot-synth run against its known optimum (moejax/data/polyglot.py): the Bayes
floor over exactly the evaluated target tokens, the last evaluation's val bpb and its
excess over the floor, the first evaluated step within 5% (and 10%) of the floor, and
per MoE layer NMI(document language, top-1 expert) over the evaluated windows' input
tokens (expert_index[:, 0] of the latest checkpoint's routing).
"""

import os

import jax
import numpy as np
from flax import nnx

from moejax.data import polyglot
from moejax.data.pipeline import build_lm_data
from moejax.errors import ConfigError
from moejax.evaluation.partitions import nmi
from moejax.train.metrics import read_jsonl
from moejax.train.restore import load_from_workdir


def top1_experts(graphdef, params, rest, batches) -> list[np.ndarray]:
  """Per MoE layer, the top-1 expert of every input token, batches in order, [N*L]."""
  forward = jax.jit(
    lambda p, r, x: [a["expert_index"][:, 0] for a in nnx.merge(graphdef, p, r)(x)[1]["moe"]]
  )
  per_batch = [jax.device_get(forward(params, rest, b["inputs"])) for b in batches]
  return [np.concatenate(layer) for layer in zip(*per_batch)]


def load_run(workdir: str):
  """(config, graphdef, params, rest, its data) of a polyglot_synth training workdir's
  latest checkpoint; ConfigError for a run on other data."""
  config, graphdef, params, rest, _ = load_from_workdir(workdir)
  if config.data.name != polyglot.NAME:
    raise ConfigError(
      f"trained on data.name={config.data.name!r}, not {polyglot.NAME!r} ({workdir})"
    )
  return config, graphdef, params, rest, build_lm_data(config.data, seed=config.seed)


def run_report(workdir: str) -> dict:
  """The figures of the module doc for one polyglot_synth training workdir."""
  config, graphdef, params, rest, data = load_run(workdir)
  num_batches = min(config.train.eval_batches, data.num_eval_batches)
  windows = num_batches * config.data.batch_size
  langs, splits = polyglot.build(config.data)
  docs, labels = splits[config.data.eval_split]
  floor = polyglot.stream_floor(langs, docs, config.data.seq_len, windows)["floor_bpb"]
  history = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  evals = [r for r in history if "val_bpb" in r]
  if not evals:
    raise ConfigError(f"{workdir}/metrics.jsonl holds no evaluation")
  languages = polyglot.token_languages(
    labels, polyglot.settings_of(config.data)["doc_len"], config.data.seq_len, windows
  ).reshape(-1)
  experts = top1_experts(graphdef, params, rest, data.eval_batches(num_batches))
  out = {
    "floor_bpb": floor,
    "step": evals[-1]["step"],
    "val_bpb": evals[-1]["val_bpb"],
    "excess": evals[-1]["val_bpb"] / floor - 1,
    "steps_to_5pct": polyglot.steps_to_within(evals, floor, tolerance=0.05),
    "steps_to_10pct": polyglot.steps_to_within(evals, floor, tolerance=0.10),
    "nmi_language_top1_expert": [nmi(languages, e) for e in experts],
    "eval_windows": windows,
  }
  return out
