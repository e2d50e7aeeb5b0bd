"""Config-driven ablations: train every variant of a sweep the same way, then tabulate.

A sweep config (configs/ablations/*.py) holds
    steps     the training budget every variant gets (train.steps)
    seed      the seed every variant gets, or
    seeds     a tuple of distinct seeds (issue 13): every variant runs on every
              seed; seed s fixes initialisation and data order (config.seed feeds
              nnx.Rngs, the grain shuffle and the step keys), so all arms on seed s
              see the same batches and pair up (moejax/train/seed_stats.py)
    common    "key=value" overrides applied to every variant (e.g. eval cadence)
    heldout_bytes_per_domain  optional: after training, score each run with the
              evaluation harness on the first N bytes of every domain of its eval
              split (the same bytes for every arm and seed, `harness.sample_documents`):
              heldout_bpb (over all of them), heldout_bpb/<domain> and
              heldout_mi_bits (I(domain; top-1 expert), mean over MoE layers);
              the seed table then compares heldout_bpb instead of val_bpb (the
              training loop's eval takes the split's first windows: one domain
              of a corpus sorted by domain)
    variants  (name, "configs/file.py[:arg]", ("key=value", ...)[, expect]) tuples;
              expect ("lower" | "higher" | None) is the paper's claimed direction of
              the metric against the first variant, the baseline
Overrides use the dotted keys of `--config.a.b=value`; each must exist in the
variant's config (a typo is a ConfigError naming it), except new entries of
`model.moe.loss_weights`, which is open by design. Values are converted to the
type of the value they replace.

`run_sweep` validates every variant before training any, trains each one in
WORKDIR/<name> with `train_and_evaluate` (an interrupted variant resumes from
its checkpoint) and writes WORKDIR/<name>/result.json when it finishes; a
variant whose result.json exists, for the same config, is not re-run. With
`seeds`, run s of a variant lives in WORKDIR/<name>/seed_<s>, runs go seed by
seed (every arm of seed 0 first) and a variant may not override `seed`.

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
from moejax.train.seed_stats import DIRECTIONS, check_seeds

MOE_COLUMNS = ("max_over_mean_load", "routing_entropy", "dropped_fraction", "padding_waste")


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  config: str  # "configs/file.py[:arg]"
  overrides: tuple = ()
  expect: str | None = None  # the paper's direction against the baseline


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
  variants = []
  for entry in sweep.variants:
    if len(entry) not in (3, 4):
      raise ConfigError(f"sweep variant {entry!r}: expected (name, config, overrides"
                        "[, expect])")
    variant = Variant(entry[0], entry[1], tuple(entry[2]), *entry[3:])
    if variant.expect not in DIRECTIONS:
      raise ConfigError(f"variant {variant.name!r} expect={variant.expect!r}: must be "
                        "'lower', 'higher' or None")
    if "seeds" in sweep and any(o.partition("=")[0] == "seed" for o in variant.overrides):
      raise ConfigError(f"variant {variant.name!r} overrides seed; with seeds= every "
                        "variant runs on every seed")
    variants.append(variant)
  names = [v.name for v in variants]
  if not variants or len(set(names)) != len(names):
    raise ConfigError(f"sweep variants={names}: need at least one, names unique")
  return variants


def sweep_seeds(sweep) -> tuple[int, ...]:
  """The sweep's seeds: `seeds` (checked: non-empty, distinct) or (`seed`,)."""
  if "seeds" not in sweep:
    return (sweep.seed,)
  if "seed" in sweep:
    raise ConfigError(f"seed={sweep.seed!r} and seeds={sweep.seeds!r} are both set; "
                      "give one of them")
  return check_seeds(sweep.seeds)


def run_dir_of(sweep, workdir: str, name: str, seed: int) -> str:
  """WORKDIR/<name>, or WORKDIR/<name>/seed_<seed> for a multi-seed sweep."""
  run_dir = os.path.join(workdir, name)
  return os.path.join(run_dir, f"seed_{seed}") if "seeds" in sweep else run_dir


def variant_config(sweep, variant: Variant, seed: int | None = None) -> ml_collections.ConfigDict:
  """The variant's full config: its file, the seed (default the sweep's `seed`) and
  common overrides, its own overrides (in a one-seed sweep a variant may set
  `seed=1`: a seed-noise reference), the budget."""
  config = load_config_file(variant.config)
  config.seed = sweep.seed if seed is None else seed
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


def heldout_figures(run_dir: str, config, bytes_per_domain: int) -> dict:
  """The harness's bpb per domain (and I(domain; expert)) of the run's last
  checkpoint on the first `bytes_per_domain` bytes of each eval-split domain."""
  from moejax.config import expert_counts
  from moejax.data.pipeline import split_documents
  from moejax.evaluation import harness
  from moejax.evaluation.model import DecoderLM
  from moejax.interop.load import load_model
  loaded, tokenizer, _ = load_model(run_dir)
  documents = harness.sample_documents(split_documents(config.data), bytes_per_domain)
  settings = harness.Settings(config.data.seq_len, batch_size=config.data.batch_size,
                              probes=())
  report = harness.evaluate(DecoderLM(loaded.config, loaded.params, loaded.rest), tokenizer,
                            tokenizer.eos_id, documents, settings,
                            expert_counts(loaded.config)).report
  out = {"heldout_bpb": report["bpb"]["all"], "heldout_bytes": report["bytes"]}
  out.update({f"heldout_bpb/{d}": v for d, v in report["bpb"].items() if d != "all"})
  if report.get("routing"):
    out["heldout_mi_bits"] = float(np.mean([layer["mutual_information_bits"]
                                            for layer in report["routing"]]))
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


def metric_of(sweep) -> str:
  """The figure the sweep's arms are compared on."""
  return "heldout_bpb" if sweep.get("heldout_bytes_per_domain") else "val_bpb"


def run_sweep(sweep, workdir: str, *, train_fn=None, log=print) -> list[dict]:
  """Train every (seed, variant) not already finished; returns one result dict per
  run, seed by seed, each with its "seed" and "expect"."""
  if sweep.get("heldout_bytes_per_domain", 0) < 0:
    raise ConfigError(f"heldout_bytes_per_domain={sweep.heldout_bytes_per_domain} must be "
                      ">= 0 (0: off)")
  if train_fn is None:
    from moejax.train.loop import train_and_evaluate as train_fn
  seeds = sweep_seeds(sweep)
  variants = variants_of(sweep)
  configs = {(s, v.name): variant_config(sweep, v, s) for s in seeds for v in variants}
  results = []  # all errors above, before any training or writing
  for seed, variant in ((s, v) for s in seeds for v in variants):
    config = configs[seed, variant.name]
    run_dir = run_dir_of(sweep, workdir, variant.name, seed)
    result_path, label = os.path.join(run_dir, "result.json"), os.path.relpath(run_dir, workdir)
    if os.path.exists(result_path):
      with open(result_path) as f:
        result = json.load(f)
      if same_config(result["config"], config):
        log(f"{label}: finished earlier, not re-run")
        results.append({**result, "seed": config.seed, "expect": variant.expect,
                        "run_dir": run_dir})
        continue
      raise ConfigError(f"{result_path} was trained with another config; remove "
                        f"{run_dir} or give the variant a new name")
    log(f"{label}: training {config.train.steps} steps in {run_dir}")
    run = train_fn(config, run_dir)
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(run.state.params))
    summary = summarize(read_jsonl(os.path.join(run_dir, "metrics.jsonl")), run.eval,
                        num_params)
    if sweep.get("heldout_bytes_per_domain"):
      summary.update(heldout_figures(run_dir, config, sweep.heldout_bytes_per_domain))
    result = {"name": variant.name, "config_spec": variant.config,
              "overrides": list(variant.overrides), "seed": config.seed, **summary,
              "config": fingerprint(config.to_dict())}
    with open(result_path + ".tmp", "w") as f:
      json.dump(result, f, indent=1)
    os.replace(result_path + ".tmp", result_path)  # atomic: never half a result
    results.append({**result, "expect": variant.expect, "run_dir": run_dir})
  return results
