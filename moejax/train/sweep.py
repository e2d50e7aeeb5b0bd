"""Config-driven ablations: train every variant of a sweep the same way, then tabulate.

A sweep config (configs/ablations/*.py) holds
    steps     the training budget every variant gets (train.steps)
    seed      the seed every variant gets
    common    "key=value" overrides applied to every variant (e.g. eval cadence)
    variants  (name, "configs/file.py[:arg]", ("key=value", ...)) tuples
Overrides use the dotted keys of `--config.a.b=value`; each must exist in the
variant's config (a typo is a ConfigError naming it), except new entries of
`model.moe.loss_weights`, which is open by design. Values are converted to the
type of the value they replace.

`run_sweep` validates every variant before training any, trains each one in
WORKDIR/<name> with `train_and_evaluate` (an interrupted variant resumes from
its checkpoint) and writes WORKDIR/<name>/result.json when it finishes; a
variant whose result.json exists, for the same config, is not re-run.

Summary figures (`summarize`): final val bpb; tokens/s as the median over log
windows (robust to the compile window and to a shared machine); MoE metrics
averaged over MoE layers and over the last quarter of the log records (the
steady state, not the warm-up).
"""
import dataclasses
import importlib.util
import json
import math
import os

import jax
import ml_collections
import numpy as np

from moejax.config import OPEN_DICTS, flatten_config, validate_config, with_defaults
from moejax.errors import ConfigError
from moejax.train.metrics import read_jsonl

MOE_COLUMNS = ("max_over_mean_load", "routing_entropy", "dropped_fraction", "padding_waste")


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  config: str  # "configs/file.py[:arg]"
  overrides: tuple = ()


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`path.py[:arg]` -> that module's get_config(arg), as --config=... would load it."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise ConfigError(f"config file {path!r} (from {spec!r}) does not exist")
  module_spec = importlib.util.spec_from_file_location(
      f"moejax_sweep_config_{abs(hash(path))}", path)
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
    raise ConfigError(f"override {key}={text!r}: {type(old).__name__} keys are set in "
                      "the variant's config file, not by an override")
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
    else:
      raise ConfigError(f"override {key}={text!r}: no config key {key!r}")


def variants_of(sweep) -> list[Variant]:
  variants = [Variant(name, spec, tuple(overrides)) for name, spec, overrides in sweep.variants]
  names = [v.name for v in variants]
  if not variants or len(set(names)) != len(names):
    raise ConfigError(f"sweep variants={names}: need at least one, names unique")
  return variants


def variant_config(sweep, variant: Variant) -> ml_collections.ConfigDict:
  """The variant's full config: its file, the sweep's seed and common overrides,
  its own overrides (a variant may set `seed=1`: a seed-noise reference), the budget."""
  config = load_config_file(variant.config)
  config.seed = sweep.seed
  apply_overrides(config, tuple(sweep.common) + variant.overrides)
  config.train.steps = sweep.steps
  config.train.progress_bar = False
  validate_config(config)
  return config


def summarize(records: list[dict], eval_result: dict, num_params: int) -> dict:
  """Table figures of one finished run from its metric records (see module doc)."""
  by_step = {r["step"]: r for r in records}  # a resumed run re-logs some steps
  records = [by_step[s] for s in sorted(by_step)]
  tail = records[len(records) - max(1, len(records) // 4):]
  out = {"val_bpb": eval_result.get("val_bpb", math.nan),
         "val_loss": eval_result.get("val_loss", math.nan),
         "tokens_per_second": float(np.median([r["tokens_per_second"] for r in records])),
         "params": num_params, "steps": records[-1]["step"]}
  for column in MOE_COLUMNS:
    values = [v for r in tail for k, v in r.items()
              if k.startswith("moe/") and k.endswith("/" + column)]
    out[column] = float(np.mean(values)) if values else math.nan
  return out


def fingerprint(config: dict) -> dict:
  """A config dict as flat JSON values: a finished variant is re-used only if it matches."""
  return json.loads(json.dumps(flatten_config(config), default=str))


def same_config(saved_fingerprint: dict, config) -> bool:
  """Whether a result.json's fingerprint is `config`'s; keys added to the schema
  since it was written count at their defaults (moejax.config.with_defaults)."""
  nested = {}
  for key, value in saved_fingerprint.items():
    *parents, leaf = key.split(".")
    node = nested
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return fingerprint(with_defaults(nested)) == fingerprint(config.to_dict())


def run_sweep(sweep, workdir: str, *, train_fn=None, log=print) -> list[dict]:
  """Train every variant not already finished; returns one result dict per variant."""
  if train_fn is None:
    from moejax.train.loop import train_and_evaluate as train_fn
  variants = variants_of(sweep)
  configs = {v.name: variant_config(sweep, v) for v in variants}  # all errors first
  results = []
  for variant in variants:
    config, run_dir = configs[variant.name], os.path.join(workdir, variant.name)
    result_path = os.path.join(run_dir, "result.json")
    if os.path.exists(result_path):
      with open(result_path) as f:
        result = json.load(f)
      if same_config(result["config"], config):
        log(f"{variant.name}: finished earlier, not re-run")
        results.append(result)
        continue
      raise ConfigError(f"{result_path} was trained with another config; remove "
                        f"{run_dir} or give the variant a new name")
    log(f"{variant.name}: training {config.train.steps} steps in {run_dir}")
    run = train_fn(config, run_dir)
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(run.state.params))
    summary = summarize(read_jsonl(os.path.join(run_dir, "metrics.jsonl")), run.eval,
                        num_params)
    result = {"name": variant.name, "config_spec": variant.config,
              "overrides": list(variant.overrides), **summary,
              "config": fingerprint(config.to_dict())}
    with open(result_path + ".tmp", "w") as f:
      json.dump(result, f, indent=1)
    os.replace(result_path + ".tmp", result_path)  # atomic: never half a result
    results.append(result)
  return results
