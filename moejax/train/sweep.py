"""Training runs for studies: a config file plus dotted overrides, trained once per run
directory and summarised (the `training` scorer, moejax/studies/scorers/training.py).

A run's config (`run_config`) is a config file ("configs/file.py[:arg]", loaded as
--config=... would load it) with "key=value" overrides applied in order, then the
seed and the step budget. Overrides use the dotted keys of `--config.a.b=value`;
each must exist in the config (a typo is a ConfigError naming it), except new
entries of `model.moe.loss_weights`, which is open by design. Values are converted
to the type of the value they replace.

`train_run` trains a config in its run directory with `train_and_evaluate` (an
interrupted run resumes from its checkpoint) and writes run_dir/result.json when it
finishes; a run directory whose result.json holds the same config is read back, not
re-run, and one holding another config is a ConfigError.

Summary figures (`summarize`): final val bpb; tokens/s as the median over log
windows (robust to the compile window and to a shared machine); MoE metrics
averaged over MoE layers and over the last quarter of the log records (the steady
state, not the warm-up). `heldout_figures`: the evaluation harness's bpb on the first
N bytes of every domain of the eval split (the same bytes for every run): the
training loop's eval takes the split's first windows, one domain of a corpus sorted
by domain.
"""

import importlib.util
import json
import math
import os

import jax
import ml_collections
import numpy as np

from moejax.config import moved_key
from moejax.migrate import flatten_config, OPEN_DICTS, with_defaults
from moejax.validation import validate_config
from moejax.errors import ConfigError
from moejax.train import init_from
from moejax.train.metrics import read_jsonl

MOE_COLUMNS = ("max_over_mean_load", "routing_entropy", "dropped_fraction", "padding_waste")
SUMMARY = ("val_bpb", "val_loss", "tokens_per_second", "params", "steps") + MOE_COLUMNS
HELDOUT = ("heldout_bpb", "heldout_bytes", "heldout_mi_bits")
RESULT = "result.json"


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`path.py[:arg]` -> that module's get_config(arg), as --config=... would load it."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise ConfigError(f"config file {path!r} (from {spec!r}) does not exist")
  module_spec = importlib.util.spec_from_file_location(
    f"moejax_sweep_config_{abs(hash(path))}", path
  )
  if module_spec is None or module_spec.loader is None:
    raise ConfigError(f"config file {path!r} (from {spec!r}) cannot be imported")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _convert(key: str, text: str, old):
  if isinstance(old, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ConfigError(f"override {key}={text!r}: expected a bool")
    return text.lower() in ("true", "1")
  if old is None or isinstance(old, str):
    return text
  if not isinstance(old, (int, float)):
    raise ConfigError(
      f"override {key}={text!r}: {type(old).__name__} keys are set in "
      "the variant's config file, not by an override"
    )
  try:
    value = float(text)
  except ValueError as err:
    raise ConfigError(f"override {key}={text!r}: expected {type(old).__name__}") from err
  if isinstance(old, int) and not value.is_integer():
    raise ConfigError(f"override {key}={text!r}: expected an integer")
  return type(old)(value)


def apply_overrides(config: ml_collections.ConfigDict, overrides) -> None:
  """Apply "a.b.c=value" strings in place (see module doc)."""
  for item in overrides:
    key, sep, text = item.partition("=")
    if not sep:
      raise ConfigError(f"override {item!r} is not key=value")
    parent_key, _, leaf = key.rpartition(".")
    parent = config
    for part in filter(None, parent_key.split(".")):
      if not isinstance(parent, ml_collections.ConfigDict) or part not in parent:
        raise ConfigError(f"override {key}={text!r}: no config key {key!r}")
      parent = parent[part]
    if not isinstance(parent, ml_collections.ConfigDict):
      raise ConfigError(f"override {key}={text!r}: no config key {key!r}")
    if leaf in parent:
      parent[leaf] = _convert(key, text, parent[leaf])
    elif parent_key.rpartition(".")[2] in OPEN_DICTS:  # e.g. model.moe.loss_weights
      parent[leaf] = float(text)
    elif moved_key(key):
      use = moved_key(key)
      raise ConfigError(f"override {key}={text!r}: a flat key of older configs; use {use}")
    else:
      raise ConfigError(f"override {key}={text!r}: no config key {key!r}")


def check_seeds(seeds) -> tuple[int, ...]:
  """Training seeds: non-empty, distinct ints in [0, 2**32); ConfigError otherwise."""
  if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
    raise ConfigError(f"seeds={seeds!r} must be a list of ints")
  seeds = tuple(seeds)
  if not seeds:
    raise ConfigError("seeds=() is empty; give at least one seed")
  if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**32 for s in seeds):
    raise ConfigError(f"seeds={list(seeds)!r} must be ints in [0, 2**32)")
  twice = sorted({s for s in seeds if seeds.count(s) > 1})
  if twice:
    raise ConfigError(f"seeds={list(seeds)!r} gives seed {twice[0]} twice; each seed once")
  return seeds


def run_config(config_file: str, overrides, *, seed: int, steps: int) -> ml_collections.ConfigDict:
  """The validated config of one run: the file, the overrides in order, then `seed`
  (initialisation, data order and step keys) and the budget `steps`."""
  config = load_config_file(config_file)
  apply_overrides(config, overrides)
  config.seed = seed
  config.train.steps = steps
  config.train.progress_bar = False
  validate_config(config)
  init_from.check_sources(config)
  return config


def summarize(records: list[dict], eval_result: dict, num_params: int) -> dict:
  """Table figures of one finished run from its metric records (see module doc)."""
  by_step = {r["step"]: r for r in records}  # a resumed run re-logs some steps
  records = [by_step[s] for s in sorted(by_step)]
  tail = records[len(records) - max(1, len(records) // 4) :]
  out = {
    "val_bpb": eval_result.get("val_bpb", math.nan),
    "val_loss": eval_result.get("val_loss", math.nan),
    "tokens_per_second": float(np.median([r["tokens_per_second"] for r in records])),
    "params": num_params,
    "steps": records[-1]["step"],
  }
  for column in MOE_COLUMNS:
    values = [
      v for r in tail for k, v in r.items() if k.startswith("moe/") and k.endswith("/" + column)
    ]
    out[column] = float(np.mean(values)) if values else math.nan
  return out


def heldout_documents(config, bytes_per_domain: int) -> list[tuple[str, str]]:
  """(domain, text) of the first `bytes_per_domain` bytes of each domain of the eval split."""
  from moejax.data.pipeline import split_documents
  from moejax.evaluation import harness

  return harness.sample_documents(split_documents(config.data), bytes_per_domain)


def heldout_figures(run_dir: str, config, bytes_per_domain: int) -> dict:
  """The harness's bpb per domain (and I(domain; expert)) of the run's last
  checkpoint on the first `bytes_per_domain` bytes of each eval-split domain."""
  from moejax.models.structure import expert_counts
  from moejax.evaluation import harness
  from moejax.evaluation.model import DecoderLM
  from moejax.train.load import load_model

  loaded, tokenizer, _ = load_model(run_dir)
  documents = heldout_documents(config, bytes_per_domain)
  settings = harness.Settings(config.data.seq_len, batch_size=config.data.batch_size, probes=())
  report = harness.evaluate(
    DecoderLM(loaded.config, loaded.params, loaded.rest),
    tokenizer,
    tokenizer.eos_id,
    documents,
    settings,
    expert_counts(loaded.config),
  ).report
  out = {"heldout_bpb": report["bpb"]["all"], "heldout_bytes": report["bytes"]}
  out.update({f"heldout_bpb/{d}": v for d, v in report["bpb"].items() if d != "all"})
  if report.get("routing"):
    out["heldout_mi_bits"] = float(
      np.mean([layer["mutual_information_bits"] for layer in report["routing"]])
    )
  return out


def fingerprint(config: dict) -> dict:
  """A config dict as flat JSON values, empty dicts kept: a finished run is re-used only
  if it matches."""
  return json.loads(json.dumps(flatten_config(config, keep_empty=True), default=str))


def same_config(saved_fingerprint: dict, config) -> bool:
  """Whether a result.json's fingerprint is `config`'s; keys added to the schema
  since it was written count at their defaults (moejax.migrate.with_defaults)."""
  nested: dict = {}
  for key, value in saved_fingerprint.items():
    *parents, leaf = key.split(".")
    node = nested
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return fingerprint(with_defaults(nested)) == fingerprint(config.to_dict())


def train_run(
  config, run_dir: str, *, heldout_bytes_per_domain: int = 0, train_fn=None, log=print
) -> dict:
  """The summary of `config` trained in `run_dir` (module doc): read back from its
  result.json when that holds the same config, else trained (resuming from the
  run's checkpoint) and written there."""
  result_path = os.path.join(run_dir, RESULT)
  if os.path.exists(result_path):
    with open(result_path) as f:
      result = json.load(f)
    if same_config(result["config"], config):
      log(f"{run_dir}: finished earlier, not re-run")
      return result
    raise ConfigError(
      f"{result_path} was trained with another config; remove {run_dir} or give the arm a new name"
    )
  if train_fn is None:
    from moejax.train.loop import train_and_evaluate as train_fn
  log(f"{run_dir}: training {config.train.steps} steps")
  run = train_fn(config, run_dir)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(run.state.params))
  result = summarize(read_jsonl(os.path.join(run_dir, "metrics.jsonl")), run.eval, num_params)
  if heldout_bytes_per_domain:
    result.update(heldout_figures(run_dir, config, heldout_bytes_per_domain))
  result = {**result, "seed": config.seed, "config": fingerprint(config.to_dict())}
  with open(result_path + ".tmp", "w") as f:
    json.dump(result, f, indent=1)
  os.replace(result_path + ".tmp", result_path)  # atomic: never half a result
  return result


def plot_curves(runs: list[tuple[str, str]], png_path: str) -> bool:
  """Training cross-entropy and validation bpb against steps: one line per
  (label, run_dir) with a metrics.jsonl, one colour per label; False if none has one."""
  runs = [(label, d) for label, d in runs if os.path.exists(os.path.join(d, "metrics.jsonl"))]
  if not runs:
    return False
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
  colours: dict[str, str] = {}
  for label, run_dir in runs:
    first = label not in colours
    colours.setdefault(label, f"C{len(colours) % 10}")
    style = dict(color=colours[label], label=label if first else None)
    by_step = {rec["step"]: rec for rec in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))}
    steps = sorted(by_step)
    ax_train.plot(steps, [by_step[s].get("ce_loss", math.nan) for s in steps], lw=1, **style)
    val = [s for s in steps if "val_bpb" in by_step[s]]
    ax_val.plot(val, [by_step[s]["val_bpb"] for s in val], marker="o", ms=3, lw=1, **style)
  ax_train.set(xlabel="step", ylabel="train cross-entropy (nats/token)", title="training loss")
  ax_val.set(xlabel="step", ylabel="validation bits per byte", title="held-out split")
  ax_val.legend(fontsize=7)
  for ax in (ax_train, ax_val):
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
  return True
