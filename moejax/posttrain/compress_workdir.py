"""Compress a training workdir's experts: calibrate on windows of its
training split, run a compress_pipeline method, optionally fine-tune the routers
through the trainer (GEMQ), and write a training workdir whose experts are the
compressed expert type.

The output workdir holds one checkpoint at the source's step (or, after router
fine-tuning, at step + finetune_steps) with the source's data-iterator state:
`experiments.train` continues it, `experiments.evaluate` scores it,
`experiments.convert` exports it (dequantized). GEMQ's router fine-tuning is
`train.trainable='router'` run by moejax.train.loop.train_and_evaluate in that
workdir (compress_pipeline.router_finetune_config).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import jax
import ml_collections
import numpy as np

from moejax.errors import ConfigError
from moejax.posttrain import compress_pipeline as cp
from moejax.posttrain import compressed_model
from moejax.posttrain import source as source_lib
from moejax.posttrain.calibration import Calibration, calibration_windows
from moejax.posttrain.request import check_request


@dataclasses.dataclass
class Result:
  """The compressed model (config, params, rest; None for the SVD baselines), the
  float model that equals it (params of the source config), and the report."""

  model: ml_collections.ConfigDict | None
  params: dict | None
  rest: dict | None
  float_params: dict
  report: dict

  def compressed(self) -> tuple[ml_collections.ConfigDict, dict, dict]:
    """(config, params, rest) of the compressed model; ValueError for a baseline."""
    if self.model is None or self.params is None or self.rest is None:
      raise ValueError("an SVD baseline has no compressed model (no expert type stores it)")
    return self.model, self.params, self.rest


def _with_routers(float_params: dict, params: dict) -> dict:
  """float_params with every router parameter taken from `params` (a model of the
  same blocks): fine-tuned routers carried to the float model."""
  from moejax.train.optimizer import is_router_path

  new = jax.tree.map(lambda leaf: leaf, float_params)
  for block, layer in params["blocks"].items():
    ffn = layer.get("ffn", {}) if isinstance(layer, dict) else {}
    for key, value in ffn.items():
      if is_router_path([key]):
        new["blocks"][block]["ffn"][key] = value
  return new


def finetune_routers(
  workdir: str,
  config,
  m,
  params,
  rest,
  step: int,
  data_state,
  steps: int,
  learning_rate: float,
  aux_losses: bool = False,
):
  """(params, rest) after GEMQ's router fine-tuning of the compressed model, run
  by the trainer in `workdir` (written: one checkpoint, then the fine-tuned one);
  the LM loss alone unless `aux_losses` (cp.router_finetune_config)."""
  from moejax.train.loop import train_and_evaluate
  from moejax.train.restore import restore

  c = cp.router_finetune_config(
    source_lib.with_model(config, m), steps, learning_rate, start_step=step, aux_losses=aux_losses
  )
  source_lib.save_training_workdir(workdir, c, params, rest, step, data_state)
  train_and_evaluate(c, workdir)
  tuned = restore(workdir, step + steps)
  return tuned.params, tuned.rest


def budgets(level: float, rounds: int, step: float, highest: float) -> list[float]:
  """GEMQ's progressive bit reduction: the average-bit budget of each round,
  lowered by `step` a round down to `level` (3 rounds to 2 bits at 0.5:
  3, 2.5, 2), none above `highest` (the widest bit choice)."""
  return [min(level + step * (rounds - 1 - k), highest) for k in range(rounds)]


def run(
  r: cp.Request,
  source: source_lib.Source,
  calibration: Calibration,
  *,
  rounds: int = 1,
  finetune_steps: int = 0,
  finetune_lr: float = 1e-4,
  workdir: str | None = None,
  bit_step: float = 0.5,
  aux_losses: bool = False,
  log=print,
) -> Result:
  """Compress `source` by `r`. GEMQ with `rounds` > 1 is its progressive bit
  reduction: round k allocates at budgets(r.level, rounds, bit_step)[k], its costs
  measured on the float model (round 0) or on the model the previous round left
  (quantized experts, fine-tuned routers) against the float experts' outputs
  (gemq.expert_costs), quantizes the float experts, and fine-tunes the routers
  `finetune_steps` steps (each round from the previous round's routers). Router
  fine-tuning writes into `workdir` (a temporary directory when None)."""
  config, source_step = source.training_run()
  float_params, current = source.params, None
  highest = max(r.bit_choices) if r.bit_choices else r.level
  schedule = budgets(r.level, rounds, bit_step, max(highest, r.level))
  rounds_report = []
  for round_index, budget in enumerate(schedule):
    c = cp.compress_experts(
      dataclasses.replace(r, level=budget), source.params, calibration, current
    )
    model: ml_collections.ConfigDict | None = None
    params: dict | None = None
    rest: dict | None = None
    if c.kind != "baseline":
      model, params, rest = compressed_model.compressed_model(
        config.model, float_params, source.rest, c
      )
    step = source_step
    if finetune_steps:
      with tempfile.TemporaryDirectory() as scratch:
        target = workdir if workdir and round_index == rounds - 1 else scratch
        params, rest = finetune_routers(
          target,
          config,
          model,
          params,
          rest,
          source_step,
          source.data_state,
          finetune_steps,
          finetune_lr,
          aux_losses,
        )
      float_params = _with_routers(float_params, params)
      step = source_step + finetune_steps
    rounds_report.append({"round": round_index, "budget": budget, **c.report})
    current = cp.with_expert_weights(float_params, c.float_weights)
    if round_index + 1 < rounds:
      log(f"round {round_index}: average bits {c.report.get('average_bits')}; re-estimating")
  report = {
    "method": r.method,
    "level": r.level,
    "quantizer": r.quantizer,
    "group_size": r.group_size,
    "rounds": rounds_report,
    "step": step,
    "finetune_steps": finetune_steps,
    "finetune_aux_losses": aux_losses,
    **c.report,
  }
  if current is None:
    raise ValueError(f"no compression round (rounds={rounds})")
  return Result(model, params, rest, current, report)


def compress_workdir(
  workdir: str,
  out: str | None,
  r: cp.Request,
  *,
  num_windows: int = 64,
  context: int = 0,
  batch_size: int = 8,
  rounds: int = 1,
  finetune_steps: int = 0,
  finetune_lr: float = 1e-4,
  bit_step: float = 0.5,
  aux_losses: bool = False,
  log=print,
) -> dict:
  """Compress `workdir`'s latest checkpoint by `r`; write `out` (new or empty) as a
  training workdir of the compressed model; return the report."""
  from moejax.data.pipeline import train_token_stream

  config, _ = source_lib.training_config(workdir)
  context = context or config.data.seq_len
  check_request(
    config.model,
    r,
    num_windows=num_windows,
    context=context,
    source=f"--workdir={workdir}",
    rounds=rounds,
    finetune_steps=finetune_steps,
  )
  if out and not cp.has_expert_type(r.method):
    raise ConfigError(
      f"--out: {r.method} has no expert type to save (score it with configs/studies/td_moe.py)"
    )
  source = source_lib.load_training(workdir)
  windows = calibration_windows(train_token_stream(config.data), num_windows, context, r.seed)
  calibration = Calibration(source.model, source.params, source.rest, windows, batch_size)
  if out:
    os.makedirs(out, exist_ok=True)
  result = run(
    r,
    source,
    calibration,
    rounds=rounds,
    finetune_steps=finetune_steps,
    finetune_lr=finetune_lr,
    workdir=out if finetune_steps else None,
    bit_step=bit_step,
    aux_losses=aux_losses,
    log=log,
  )
  if out and not finetune_steps:
    m, params, rest = result.compressed()
    source_lib.save_training_workdir(
      out,
      source_lib.with_model(config, m),
      params,
      rest,
      source.training_run()[1],
      source.data_state,
    )
  report = {
    "source": workdir,
    "calibration": {"windows": num_windows, "context": context, "seed": r.seed},
    **result.report,
  }
  if result.model is not None:
    report["packed_bytes"] = packed_bytes(*result.compressed())
  return report


def packed_bytes(m, params: dict, rest: dict) -> int:
  """Bytes of the model's compressed expert layers in their packed form
  (compress.storage_report), or the float32 bytes of factorised ones."""
  from flax import nnx
  from moejax.models.decoder import abstract_model
  from moejax.posttrain import compress

  graphdef = abstract_model(m)[0]
  model = nnx.merge(graphdef, params, rest)
  rows = compress.storage_report(model)
  if rows:
    return int(sum(row["packed_bytes"] for row in rows))
  return int(
    sum(
      np.asarray(v).nbytes
      for b in params["blocks"].values()
      if isinstance(b, dict) and "ffn" in b and "experts" in b["ffn"]
      for v in jax.tree.leaves(b["ffn"]["experts"])
    )
  )
