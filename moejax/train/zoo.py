"""The checkpoint zoo: train, cache, fingerprint and evaluate
the models of configs/zoo.py (whose `model_config` the callers pass in as
`config_of(name, zoo_dir, seed)`: the library imports no experiment config).

Each model trains deterministically into ZOO_DIR/<name> (ZOO_DIR/<name>_seed<k>
at training seed k > 0) with a snapshot at
every 10% of training. `parameter_digests` fingerprints every snapshot (sha256
over the float32 bytes of every parameter and router state, paths sorted), so
a second training (`verify`) either reproduces the zoo bit for bit or names
the first snapshot that differs. ZOO_DIR/<name>/zoo.json holds the digests, the
training time and the evaluation report (moejax/evaluation harness: bpb per
domain on the first N bytes of every held-out domain, probes, routing); a
finished model whose config is unchanged is not retrained.
"""

import hashlib
import json
import os
import shutil
import tempfile
import time

import jax
import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation.stats import markdown_table

ZOO_JSON = "zoo.json"


def workdir_of(name: str, zoo_dir: str, seed: int = 0) -> str:
  """ZOO_DIR/<name> for training seed 0, ZOO_DIR/<name>_seed<k> for seed k."""
  return os.path.join(zoo_dir, name if seed == 0 else f"{name}_seed{seed}")


def over_seeds(study, arg: str | None, name: str = "s", zoo_dir: str = "runs/zoo"):
  """A post-training study config over zoo model `name` at training seeds 0 .. N-1,
  from the config arg 'seeds=N' (configs/studies/pruning.py:seeds=3): its `models`
  (moejax/studies/spec.py) are the seeds' workdirs. N=1 (no arg): `study` unchanged."""
  from moejax.config import parse_config_arg

  seeds = parse_config_arg(arg, {"seeds": 1}).seeds
  if seeds < 1:
    raise ConfigError(f"config arg seeds={seeds} must be >= 1")
  if seeds > 1:
    study.models = [{"workdir": workdir_of(name, zoo_dir, seed)} for seed in range(seeds)]
  return study


def parameter_digests(workdir: str) -> dict[str, str]:
  """{step: sha256 of the snapshot's parameters and router state} of every checkpoint."""
  from moejax.train.checkpoint import Checkpointer
  from moejax.train.restore import load_from_workdir

  ckpt = Checkpointer(workdir, read_only=True)
  steps = ckpt.all_steps()
  ckpt.close()
  return {str(step): tree_digest(*load_from_workdir(workdir, step)[2:4]) for step in steps}


def tree_digest(params, rest) -> str:
  """sha256 over every leaf's path and float32 bytes, paths sorted."""
  digest = hashlib.sha256()
  leaves = jax.tree_util.tree_flatten_with_path({"params": params, "rest": rest})[0]
  for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
    digest.update(jax.tree_util.keystr(path).encode())
    digest.update(np.ascontiguousarray(np.asarray(leaf, np.float32)).tobytes())
  return digest.hexdigest()


def evaluate(workdir: str, config, bytes_per_domain: int, probe_count: int) -> dict:
  """The harness report of the workdir's last snapshot on its held-out documents."""
  from moejax.models.structure import expert_counts
  from moejax.data.pipeline import split_documents
  from moejax.evaluation import harness
  from moejax.evaluation.model import DecoderLM
  from moejax.evaluation.probe_data import default_probes
  from moejax.train.load import load_model

  loaded, tokenizer, _ = load_model(workdir)
  documents = harness.sample_documents(split_documents(config.data), bytes_per_domain)
  settings = harness.Settings(
    config.data.seq_len,
    batch_size=config.data.batch_size,
    probes=tuple(default_probes(config.data.name)),
    probe_count=probe_count,
  )
  lm = DecoderLM(loaded.config, loaded.params, loaded.rest)
  report = harness.evaluate(
    lm, tokenizer, tokenizer.eos_id, documents, settings, expert_counts(loaded.config)
  ).report
  return {"bytes_per_domain": bytes_per_domain, **report}


def train(
  config_of, name: str, zoo_dir: str, workdir: str | None = None, log=print, seed: int = 0
) -> dict:
  """Train `name` at `seed` into `workdir` (default `workdir_of`); its digests and time."""
  from moejax.train.loop import train_and_evaluate

  workdir = workdir or workdir_of(name, zoo_dir, seed)
  config = config_of(name, zoo_dir, seed)
  log(f"{name} (seed {seed}): training {config.train.steps} steps in {workdir}")
  start = time.perf_counter()
  run = train_and_evaluate(config, workdir)
  seconds = time.perf_counter() - start
  return {
    "name": name,
    "seed": seed,
    "steps": config.train.steps,
    "train_seconds": round(seconds, 1),
    "tokens_per_second": round(run.tokens_per_second, 1),
    "final_eval": run.eval,
    "snapshots": parameter_digests(workdir),
    "config": json.loads(config.to_json_best_effort()),
  }


def build(
  config_of,
  name: str,
  zoo_dir: str,
  bytes_per_domain: int,
  probe_count: int,
  log=print,
  seed: int = 0,
) -> dict:
  """Train (unless cached with the same config) and evaluate one zoo model."""
  workdir = workdir_of(name, zoo_dir, seed)
  path = os.path.join(workdir, ZOO_JSON)
  config = config_of(name, zoo_dir, seed)
  if os.path.exists(path):
    with open(path) as f:
      entry = json.load(f)
    if entry["config"] == json.loads(config.to_json_best_effort()):
      log(f"{name}: cached in {workdir}")
      return entry
    raise ConfigError(f"{path} was trained with another config; remove {workdir}")
  entry = train(config_of, name, zoo_dir, log=log, seed=seed)
  entry["eval"] = evaluate(workdir, config, bytes_per_domain, probe_count)
  with open(path + ".tmp", "w") as f:
    json.dump(entry, f, indent=1)
  os.replace(path + ".tmp", path)
  return entry


def verify(config_of, name: str, zoo_dir: str, log=print, seed: int = 0) -> dict:
  """Retrain `name` in a temporary directory and compare every snapshot's digest
  with the cached zoo.json: {"bit_exact": bool, "first_difference": step or None}."""
  with open(os.path.join(workdir_of(name, zoo_dir, seed), ZOO_JSON)) as f:
    expected = json.load(f)["snapshots"]
  scratch = tempfile.mkdtemp(prefix=f"moejax-zoo-{name}-")
  try:
    again = train(config_of, name, zoo_dir, os.path.join(scratch, name), log=log, seed=seed)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return {
    **compare_snapshots(expected, again["snapshots"]),
    "train_seconds": again["train_seconds"],
  }


def compare_snapshots(expected: dict, again: dict) -> dict:
  """bit_exact: the same steps with the same digests; else the first step that
  differs (or is missing on either side)."""
  differing = [s for s in set(expected) | set(again) if expected.get(s) != again.get(s)]
  return {
    "bit_exact": not differing,
    "snapshots": len(expected),
    "first_difference": min(differing, key=int) if differing else None,
  }


def label(entry: dict) -> str:
  """The model's name, with its training seed when not 0."""
  seed = entry.get("seed", 0)
  return entry["name"] if seed == 0 else f"{entry['name']} seed {seed}"


def table(entries: list[dict]) -> str:
  """Markdown: per model, time, held-out bpb per domain, probes, routing."""
  domains = sorted({d for e in entries for d in e["eval"]["bpb"] if d != "all"})
  runs = markdown_table(
    ["model", "steps", "train min", "tokens/s", *domains, "all"],
    [
      [
        label(e),
        e["steps"],
        f"{e['train_seconds'] / 60:.1f}",
        f"{e['tokens_per_second']:.0f}",
        *(f"{e['eval']['bpb'][d]:.3f}" for d in domains + ["all"]),
      ]
      for e in entries
    ],
  )
  probes = markdown_table(
    ["model", "probe", "group", "accuracy (n)"],
    [
      [
        label(e),
        probe,
        group,
        f"{'—' if v['accuracy'] is None else format(v['accuracy'], '.3f')} ({v['n']})",
      ]
      for e in entries
      for probe, groups in e["eval"]["probes"].items()
      for group, v in groups.items()
    ],
  )
  routing = markdown_table(
    ["model", "MoE layer", "I(domain; expert) bits", "of H(domain)", "max/mean load"],
    [
      [
        label(e),
        j,
        f"{layer['mutual_information_bits']:.4f}",
        f"{layer['domain_entropy_bits']:.4f}",
        f"{layer['max_over_mean_load']:.3f}",
      ]
      for e in entries
      for j, layer in enumerate(e["eval"].get("routing", []))
    ],
  )
  return "\n\n".join([runs, probes, routing]) + "\n"
