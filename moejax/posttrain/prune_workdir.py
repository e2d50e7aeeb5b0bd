"""Expert pruning of a whole source, end to end:

  source.load -> calibration windows -> prune.prune_model -> a new workdir

A training workdir is calibrated on its own training split (`prune_workdir`) and
written as a training workdir holding one checkpoint, at the source's step, with
the pruned model config (`model.moe.expert_counts`), the pruned parameters and
router state, a fresh optimizer state for them and the source's data-iterator
state: `experiments.train` continues it (fine-tuning), and `experiments.evaluate`,
`experiments.generate` and `experiments.profile_phenomena` read it like any other
run. An HF checkpoint or a converted workdir is calibrated on a file
(`prune_imported`) and written as a converted workdir.

Calibration: `num_windows` windows of `context` tokens at offsets drawn with
`seed` (calibration.calibration_windows), so five seeds give five calibration draws.
"""

from __future__ import annotations

import os

from moejax.models.structure import expert_counts
from moejax.posttrain import prune, source as source_lib
from moejax.posttrain.calibration import calibration_stream, calibration_windows
from moejax.posttrain.request import check_request


def prune_workdir(
  workdir: str,
  out: str | None,
  *,
  keep: str,
  method: str,
  objective: str = "rescaled",
  num_windows: int = 64,
  context: int = 0,
  seed: int = 0,
  batch_size: int = 8,
  rescale: bool = False,
  save_statistics: str | None = None,
) -> dict:
  """Prune every MoE layer of `workdir`'s latest checkpoint; write `out` (if given);
  return the report (kept experts and relative err per layer, counts, settings)."""
  from moejax.data.pipeline import train_token_stream

  config, _ = source_lib.training_config(workdir)
  context = context or config.data.seq_len
  request = prune.Pruning(method, keep, objective, rescale, seed)
  check_request(
    config.model, request, num_windows=num_windows, context=context, source=f"--workdir={workdir}"
  )
  source = source_lib.load_training(workdir)
  windows = calibration_windows(train_token_stream(config.data), num_windows, context, seed)
  new_m, params, rest, layers = prune.prune_model(
    source.model,
    source.params,
    source.rest,
    windows,
    keep=keep,
    method=method,
    objective=objective,
    seed=seed,
    batch_size=batch_size,
    rescale=rescale,
    save_statistics=save_statistics,
  )
  if out:
    run_config, step = source.training_run()
    source_lib.save_training_workdir(
      out, source_lib.with_model(run_config, new_m), params, rest, step, source.data_state
    )
  return {
    "source": workdir,
    "step": source.step,
    "method": method,
    "objective": objective,
    "keep": keep,
    "rescale": rescale,
    "calibration": {"windows": num_windows, "context": context, "seed": seed},
    "layers": layers,
    "expert_counts": expert_counts(new_m),
  }


def prune_imported(
  *,
  hf_dir: str | None,
  workdir: str | None,
  out: str | None,
  calibration: str,
  keep: str,
  method: str,
  objective: str = "rescaled",
  num_windows: int = 64,
  context: int = 0,
  seed: int = 0,
  batch_size: int = 8,
  rescale: bool = False,
  save_statistics: str | None = None,
) -> dict:
  """Prune an HF checkpoint or a converted workdir, calibrated on `calibration`
  (calibration.calibration_stream); `out` becomes a converted workdir (tokenizer
  files copied)."""
  from moejax.interop.convert import Loaded, save_workdir

  source = source_lib.load(workdir, hf_dir)
  m = source.model
  context = context or min(m.max_seq_len, 512)
  check_request(
    m,
    prune.Pruning(method, keep, objective, rescale, seed),
    num_windows=num_windows,
    context=context,
    source=source.where,
  )
  stream = calibration_stream(calibration, source.tokenizer, source.eos_id, m.vocab_size)
  windows = calibration_windows(stream, num_windows, context, seed, f"--calibration={calibration}")
  new_m, params, rest, layers = prune.prune_model(
    m,
    source.params,
    source.rest,
    windows,
    keep=keep,
    method=method,
    objective=objective,
    seed=seed,
    batch_size=batch_size,
    rescale=rescale,
    save_statistics=save_statistics,
  )
  if out:
    source_files = hf_dir or (os.path.join(workdir, "model") if workdir else None)
    save_workdir(out, Loaded(new_m, params, rest, source.hf_config), source_files)
  return {
    "source": hf_dir or workdir,
    "method": method,
    "objective": objective,
    "keep": keep,
    "rescale": rescale,
    "calibration": {"file": calibration, "windows": num_windows, "context": context, "seed": seed},
    "layers": layers,
    "expert_counts": expert_counts(new_m),
  }
