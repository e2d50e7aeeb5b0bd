"""Expert pruning of a training workdir, end to end (issue 14):

  calibration windows -> contributions.layer_statistics -> expert_subset.choose
  per MoE layer -> surgery.remove_experts -> a new training workdir

The pruned workdir holds one checkpoint, at the source's step, with the pruned
model config (`model.moe.expert_counts`), the pruned parameters and router
state, a fresh optimizer state for them and the source's data-iterator state:
`experiments.train` continues it (fine-tuning), and `experiments.evaluate`,
`experiments.generate` and `experiments.profile_phenomena` read it like any
other run.

Calibration: `num_windows` windows of `context` tokens at offsets drawn with
`seed` from the training split of the data the source trained on (the same
tokenizer), so five seeds give five calibration draws.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax
import ml_collections
import numpy as np

from moejax.config import expert_counts, moe_layer_indices
from moejax.errors import ConfigError
from moejax.posttrain import atoms, contributions, expert_subset, surgery
from moejax.posttrain.methods import ATOM_METHODS, METHODS


KNEE = "knee"  # --keep=knee: each layer's budget at the knee of err(m) (expert_subset.knee)


def kept_count(keep: str, num_experts: int, top_k: int) -> int:
  """--keep as a count: a fraction of E in (0, 1] ('0.5') or a count ('8')."""
  try:
    value = float(keep) if "." in keep else int(keep)
  except ValueError:
    raise ConfigError(f"--keep={keep}: expected a fraction of the experts in (0, 1] "
                      f"(0.5), a count (8) or {KNEE!r}") from None
  count = round(value * num_experts) if isinstance(value, float) else value
  if isinstance(value, float) and not 0 < value <= 1:
    raise ConfigError(f"--keep={keep}: a fraction must be in (0, 1]")
  if count > num_experts:
    raise ConfigError(f"--keep={keep} is larger than the layer's {num_experts} experts")
  if count < top_k:
    raise ConfigError(f"--keep={keep} keeps {count} experts, below the router's "
                      f"top_k={top_k}")
  return count


def calibration_windows(stream: np.ndarray, num_windows: int, context: int,
                        seed: int) -> np.ndarray:
  """int32 [num_windows, context]: windows at offsets drawn uniformly with `seed`."""
  if len(stream) < context + 1:
    raise ConfigError(f"the training split has {len(stream)} tokens, fewer than one "
                      f"calibration window of {context}")
  starts = np.random.default_rng(seed).integers(0, len(stream) - context + 1, num_windows)
  return np.stack([stream[s:s + context] for s in starts]).astype(np.int32)


@dataclasses.dataclass
class Source:
  config: ml_collections.ConfigDict
  params: dict
  rest: dict
  data_state: dict
  step: int


def source_config(workdir: str):
  """(config, step) of the training workdir's latest checkpoint: metadata only."""
  from moejax.train.checkpoint import latest_config
  return latest_config(workdir)


def load_source(workdir: str, config, step: int) -> Source:
  """The checkpoint of `step`, data-iterator state included."""
  from moejax.train.checkpoint import Checkpointer
  from moejax.train.loop import init_state
  _, state, _ = init_state(config)
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    state, data_state = ckpt.restore(step, jax.tree.map(np.asarray, state))
  finally:
    ckpt.close()
  return Source(config, jax.tree.map(np.asarray, state.params),
                jax.tree.map(np.asarray, state.rest), data_state, step)


def atom_fraction(keep: str) -> float:
  """--keep for an atom method: the fraction of all expert atoms kept, in (0, 1]."""
  try:
    value = float(keep)
  except ValueError:
    value = None
  if value is None or "." not in keep or not 0 < value <= 1:
    raise ConfigError(f"--keep={keep}: an atom method keeps a fraction of all atoms, "
                      "in (0, 1] (0.75)")
  return value


MIN_TOKENS_PER_EXPERT = 16  # routed calibration tokens per expert, on average


def check_request(m, keep: str, method: str, objective: str, rescale: bool,
                  num_windows: int, context: int, where: str) -> None:
  """Every refusal that needs no compute, for the model config `m`: no MoE layer, a
  scanned model, --keep against every layer, an unknown method or objective,
  --rescale without the rescaled objective, a calibration set too small for the
  Gram statistics."""
  check_calibration(m, num_windows, context, where)
  if method not in METHODS:
    from moejax.errors import choice_error
    raise choice_error("--method", method, METHODS)
  if method in ATOM_METHODS:
    atom_fraction(keep)
    if m.moe.experts != "swiglu":
      raise ConfigError(f"--method={method} prunes the hidden units of SwiGLU experts, not "
                        f"of model.moe.experts={m.moe.experts!r} ({where})")
  elif keep == KNEE:
    if method == "step":
      raise ConfigError("--keep=knee reads err(m) of the Gram objective; --method=step "
                        "merges experts, which that error does not describe")
  else:
    for count in expert_counts(m):
      kept_count(keep, count, m.moe.top_k)
  if objective not in expert_subset.OBJECTIVES:
    from moejax.errors import choice_error
    raise choice_error("--objective", objective, expert_subset.OBJECTIVES)
  if rescale and objective != "rescaled":
    raise ConfigError("--rescale folds the least-squares weights of --objective=rescaled "
                      f"(--objective={objective})")


def check_calibration(m, num_windows: int, context: int, where: str) -> None:
  """The refusals of any calibrated post-training tool (pruning, compression): no MoE
  layer, a scanned model, a context past max_seq_len, fewer than
  MIN_TOKENS_PER_EXPERT routed tokens per expert."""
  if not moe_layer_indices(m):
    raise ConfigError(f"the checkpoint has no MoE layer: nothing to prune or compress "
                      f"({where})")
  if m.scan_layers:
    raise ConfigError(f"model.scan_layers=True: calibration reads the loop layout ({where})")
  if context > m.max_seq_len:
    raise ConfigError(f"--context={context} exceeds model.max_seq_len={m.max_seq_len}")
  routed, needed = num_windows * context * m.moe.top_k, MIN_TOKENS_PER_EXPERT * max(
      expert_counts(m))
  if routed < needed:
    raise ConfigError(f"--num_windows={num_windows} x --context={context} routes {routed} "
                      f"token-expert pairs per layer, fewer than {MIN_TOKENS_PER_EXPERT} per "
                      f"expert ({needed}) for the calibration statistics")


def choose_experts(stats, keep: str, top_k: int, method: str, objective: str, seed: int):
  """{block: kept experts} and {block: err(S) / err(empty)} for every MoE layer.
  keep=knee: per layer, the method's subsets for m = top_k..E, and the m at the
  knee of their err(m) (SCHUR-A*'s layer budgets; with schur_astar, err(m) is the
  optimal curve)."""
  kept, errors = {}, {}
  for layer in stats:
    total = max(expert_subset.subset_error(layer.gram, (), objective), 1e-300)
    relative = lambda subset: expert_subset.subset_error(layer.gram, subset, objective) / total
    pick = lambda m: expert_subset.choose(layer, m, method, objective, [seed, layer.block])
    if keep == KNEE:
      subsets = [pick(m) for m in range(top_k, len(layer.gram) + 1)]
      curve = [relative(subset) for subset in subsets]
      kept[layer.block] = subsets[expert_subset.knee(curve) - 1]
    else:
      kept[layer.block] = pick(kept_count(keep, len(layer.gram), top_k))
    errors[layer.block] = relative(kept[layer.block])
  return kept, errors


def save_pruned(out: str, config, params: dict, rest: dict, step: int, data_state) -> None:
  """A training workdir at `out` holding one checkpoint of the pruned model."""
  from moejax.train import step as step_lib
  from moejax.train.checkpoint import Checkpointer, jsonable
  optimizer = step_lib.make_optimizer(config.train)
  state = step_lib.TrainState(np.int32(step), params, rest, optimizer.init(params))
  os.makedirs(out, exist_ok=True)
  ckpt = Checkpointer(out, config.train.max_to_keep)
  ckpt.save(step, state, data_state, {"config": jsonable(config.to_dict())})
  ckpt.close()


STEP_RHO = 0.25  # Step: the fraction of calibration tokens kept by loss (a guess)


def most_similar_kept(gram: np.ndarray, kept) -> dict:
  """{pruned expert: the kept expert of largest cosine G_ij / sqrt(G_ii G_jj)}."""
  gram = np.asarray(gram, np.float64)
  norm = np.sqrt(np.maximum(np.diag(gram), 1e-300))
  cosine = gram / norm[:, None] / norm[None, :]
  kept = list(kept)
  return {p: kept[int(np.argmax(cosine[p, kept]))] for p in range(len(gram)) if p not in kept}


class Calibration:
  """The statistics every method reads, computed once per calibration set and only
  when a method asks: `stats` (contributions.layer_statistics; with Step's scores
  once `step_scores` ran) and `atom_sums` (atoms.atom_sums, HEAPr)."""

  def __init__(self, m, params: dict, rest: dict, windows: np.ndarray, batch_size: int = 8):
    from moejax.models.decoder import abstract_model
    self.graphdef = abstract_model(m)[0]
    self.params, self.rest = params, rest
    self.batches = [windows[i:i + batch_size] for i in range(0, len(windows), batch_size)]

  @functools.cached_property
  def stats(self) -> list:
    return contributions.layer_statistics(self.graphdef, self.params, self.rest, self.batches)

  def with_step_scores(self) -> list:
    if self.stats[0].step_score is None:
      from moejax.posttrain import taylor
      scores = taylor.layer_step_scores(self.graphdef, self.params, self.rest, self.batches,
                                        STEP_RHO)
      for layer, score in zip(self.stats, scores):
        layer.step_score = score
    return self.stats

  @functools.cached_property
  def atom_sums(self) -> dict:
    return atoms.atom_sums(self.graphdef, self.params, self.rest, self.batches)


def prune_atoms(m, params: dict, rest: dict, calibration: Calibration, *, keep: str,
                method: str, seed: int = 0):
  """HEAPr-style global atom pruning (posttrain/atoms.py): keep the `keep` fraction
  of all atoms by ATOM_METHODS[method]'s score."""
  fraction = atom_fraction(keep)
  scores = atoms.atom_scores(calibration.atom_sums, ATOM_METHODS[method], params, seed)
  kept = atoms.global_keep(scores, fraction)
  new_m, params = atoms.remove_atoms(m, params, kept)
  layers = [{"block": block, "experts": int(mask.shape[0]),
             "kept_atoms": [int(n) for n in mask.sum(axis=1)]} for block, mask in kept.items()]
  return new_m, params, rest, layers


def prune_model(m, params: dict, rest: dict, windows: np.ndarray | None = None, *, keep: str,
                method: str, objective: str = "rescaled", seed: int = 0, batch_size: int = 8,
                rescale: bool = False, calibration: Calibration | None = None,
                save_statistics: str | None = None):
  """(pruned model config, params, rest, per-layer report) of the model config `m`
  (loop layout) calibrated on token windows [N, L] (or a shared `calibration`);
  pure-dict params and rest. Atom methods (ATOM_METHODS) keep a fraction of
  every layer's atoms together; the others keep experts per layer.
  save_statistics: write the expert statistics there (.npz) as well."""
  if calibration is None:
    calibration = Calibration(m, params, rest, windows, batch_size)
  if save_statistics:
    contributions.save_statistics(save_statistics, calibration.stats)
  if method in ATOM_METHODS:
    return prune_atoms(m, params, rest, calibration, keep=keep, method=method, seed=seed)
  stats = (calibration.with_step_scores() if method in expert_subset.STEP_METHODS
           else calibration.stats)
  kept, errors = choose_experts(stats, keep, m.moe.top_k, method, objective, seed)
  scales = ({layer.block: expert_subset.rescale_weights(layer.gram, kept[layer.block])
             for layer in stats} if rescale else None)
  if method == "step":  # merge each pruned expert into its most similar kept one
    for layer in stats:
      params = surgery.merge_experts(params, layer.block,
                                     most_similar_kept(layer.gram, kept[layer.block]),
                                     layer.mass)
  new_m, params, rest = surgery.remove_experts(m, params, rest, kept, scales)
  layers = [{"block": layer.block, "experts": len(layer.gram), "kept": list(kept[layer.block]),
             "relative_error": errors[layer.block]} for layer in stats]
  return new_m, params, rest, layers


def prune_workdir(workdir: str, out: str | None, *, keep: str, method: str,
                  objective: str = "rescaled", num_windows: int = 64, context: int = 0,
                  seed: int = 0, batch_size: int = 8, rescale: bool = False,
                  save_statistics: str | None = None) -> dict:
  """Prune every MoE layer of `workdir`'s latest checkpoint; write `out` (if given);
  return the report (kept experts and relative err per layer, counts, settings)."""
  from moejax.data.pipeline import train_token_stream
  config, step = source_config(workdir)
  context = context or config.data.seq_len
  check_request(config.model, keep, method, objective, rescale, num_windows, context,
                f"--workdir={workdir}")
  source = load_source(workdir, config, step)
  windows = calibration_windows(train_token_stream(config.data), num_windows, context, seed)
  new_m, params, rest, layers = prune_model(config.model, source.params, source.rest, windows,
                                            keep=keep, method=method, objective=objective,
                                            seed=seed, batch_size=batch_size, rescale=rescale,
                                            save_statistics=save_statistics)
  config = ml_collections.ConfigDict(config.to_dict())
  config.model = new_m
  if out:
    save_pruned(out, config, params, rest, source.step, source.data_state)
  return {"source": workdir, "step": source.step, "method": method, "objective": objective,
          "keep": keep, "rescale": rescale, "calibration": {"windows": num_windows,
                                                            "context": context, "seed": seed},
          "layers": layers, "expert_counts": expert_counts(new_m)}


def calibration_stream(path: str, tokenizer, eos_id: int | None) -> np.ndarray:
  """Calibration tokens from a file: a .npy array of token ids (any shape, read
  flat), or a .jsonl file of {"text": ...} lines tokenized with the model's own
  tokenizer, each document followed by its eos id."""
  from moejax import cli
  cli.input_file("calibration", path)
  if path.endswith(".npy"):
    try:
      ids = np.load(path)
    except ValueError as e:
      raise ConfigError(f"cannot read token ids: {e} (--calibration={path})") from None
    if not np.issubdtype(ids.dtype, np.integer):
      raise ConfigError(f"token ids must be integers, got {ids.dtype} (--calibration={path})")
    return ids.reshape(-1).astype(np.int32)
  if not path.endswith(".jsonl"):
    raise ConfigError(f"expected a .npy file of token ids or a .jsonl file of texts "
                      f"(--calibration={path})")
  if tokenizer is None:
    raise ConfigError(f"the model has no tokenizer (tokenizer.json) to read texts with; "
                      f"give token ids as .npy (--calibration={path})")
  import json
  parts = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        text = json.loads(line)["text"]
      except (json.JSONDecodeError, KeyError, TypeError):
        raise ConfigError(f'line {number} is not {{"text": ...}} (--calibration={path})') from None
      parts.append(np.asarray(tokenizer.encode(text), np.int32))
      if eos_id is not None:
        parts.append(np.array([eos_id], np.int32))
  return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def prune_imported(*, hf_dir: str | None, workdir: str | None, out: str | None,
                   calibration: str, keep: str, method: str, objective: str = "rescaled",
                   num_windows: int = 64, context: int = 0, seed: int = 0,
                   batch_size: int = 8, rescale: bool = False,
                   save_statistics: str | None = None) -> dict:
  """Prune an HF checkpoint or a converted workdir, calibrated on `calibration`
  (calibration_stream); `out` becomes a converted workdir (tokenizer files copied)."""
  from moejax.interop.convert import Loaded, save_workdir
  from moejax.interop.load import load_model
  loaded, tokenizer, eos_id = load_model(workdir, hf_dir)
  m = loaded.config
  where = f"--hf_dir={hf_dir}" if hf_dir else f"--workdir={workdir}"
  context = context or min(m.max_seq_len, 512)
  check_request(m, keep, method, objective, rescale, num_windows, context, where)
  stream = calibration_stream(calibration, tokenizer, eos_id)
  if stream.size and stream.max() >= m.vocab_size:
    raise ConfigError(f"token id {int(stream.max())} is outside the model's vocabulary of "
                      f"{m.vocab_size} (--calibration={calibration})")
  windows = calibration_windows(stream, num_windows, context, seed)
  new_m, params, rest, layers = prune_model(m, loaded.params, loaded.rest, windows, keep=keep,
                                            method=method, objective=objective, seed=seed,
                                            batch_size=batch_size, rescale=rescale,
                                            save_statistics=save_statistics)
  if out:
    source_files = hf_dir or (os.path.join(workdir, "model") if workdir else None)
    save_workdir(out, Loaded(new_m, params, rest, loaded.hf_config), source_files)
  return {"source": hf_dir or workdir, "method": method, "objective": objective,
          "keep": keep, "rescale": rescale,
          "calibration": {"file": calibration, "windows": num_windows, "context": context,
                          "seed": seed},
          "layers": layers, "expert_counts": expert_counts(new_m)}
