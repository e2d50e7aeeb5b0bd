"""The training loop: build, resume, step, evaluate, log, checkpoint.

Exact resume: the step's PRNG key is fold_in(seed, step), the optimizer and
router state are checkpointed with the params, and the grain iterator state is
saved with every checkpoint; so N steps + resume + N steps equals 2N steps
bit for bit.

Many devices (the config's `mesh`, moejax/sharding.py): the state is created
and checkpointed in its shards, every process feeds its own batch rows, and
process 0 alone writes metrics (moejax/train/distributed.py). One device runs
the plain program.
"""

import dataclasses
import math
import os
import time

import jax
import numpy as np
from absl import logging

from moejax.models.structure import moe_layer_indices
from moejax.validation import validate_config, validate_micro_batches
from moejax.errors import ConfigError
from moejax.sharding import make_layout
from moejax.train import init_from
from moejax.train import step as step_lib
from moejax.train.build import build_model, init_state
from moejax.train.checkpoint import Checkpointer, jsonable
from moejax.train.distributed import make_placement, process_zero_first
from moejax.train.metrics import MetricWriter, flatten_metrics, plot_expert_load
from moejax.train.tasks import task_of


class NonFiniteLossError(FloatingPointError):
  """Training produced a NaN/inf loss; the last good checkpoint was kept."""


@dataclasses.dataclass
class Run:
  """What a finished run returns (also useful to tests)."""

  state: step_lib.TrainState
  start_step: int  # 0 for a fresh run, else the step it resumed from
  history: list  # flat metric records, one per log step
  eval: dict  # last evaluation: val_loss and val_bpb (lm) or val_accuracy (classification)
  tokens_per_second: float


def _check_finite(loss: float, step: int, ckpt: Checkpointer) -> None:
  if not math.isfinite(loss):
    ckpt.wait()
    raise NonFiniteLossError(
      f"loss is {loss} at step {step}; training stopped. The last good "
      f"checkpoint (step {ckpt.latest_step()}) in {ckpt.directory} is kept."
    )


def train_and_evaluate(
  config, workdir: str, *, write_metrics: bool = True, stop_at_step: int | None = None, devices=None
) -> Run:
  """Train `config` in `workdir`, resuming from its latest checkpoint.

  stop_at_step: stop (with a checkpoint) after this step, as a preempted job
  would; a later call with the same workdir continues where it stopped.
  devices: the devices to run on (default all of them), laid out by the
  config's `mesh`; on one device, the plain single-device program.
  """
  config = init_from.resolve_config(config)
  validate_config(config)
  init_from.check_sources(config)
  layout = make_layout(config, devices)  # None on one device: the plain program
  t = config.train
  placement, put = None, lambda batch: batch
  data_shard = {"shard_index": jax.process_index(), "shard_count": jax.process_count()}
  if layout is not None:
    # The mesh is known now: every micro-batch must keep rows on every batch shard.
    validate_micro_batches(config, layout.size(layout.mesh_axes("batch")))
    placement = make_placement(config, layout, build_model)
    data_shard, put = placement.data_shard(), placement.global_batch
  task = task_of(config)  # moejax/train/tasks.py: the data and the evaluation
  # A task's own sources (a distillation teacher) are checked before data is read.
  attach = None if task.prepare is None else task.prepare(config, layout)
  data = process_zero_first(lambda: task.build_data(config.data, seed=config.seed, **data_shard))
  objective = None  # a task's term of the train step's loss
  if attach is not None:
    data, objective = attach(data)
  if hasattr(data, "vocab_size") and data.vocab_size > config.model.vocab_size:
    raise ConfigError(
      f"model.vocab_size={config.model.vocab_size} is smaller than the "
      f"tokenizer's vocabulary ({data.vocab_size})"
    )
  if placement is None:
    graphdef, state, optimizer = init_state(config)
  else:
    graphdef, optimizer, state = placement.graphdef, placement.optimizer, placement.init_state()
  is_chief = jax.process_index() == 0  # writes metrics and plots
  moe_layers = moe_layer_indices(config.model)
  meta = {"config": jsonable(config.to_dict())}

  os.makedirs(workdir, exist_ok=True)  # only now: a refused config or data leaves no workdir
  ckpt = Checkpointer(workdir, t.max_to_keep)
  latest = ckpt.latest_step()
  if latest is not None:
    ckpt.check_compatible(latest, meta)
    target = (
      jax.tree.map(np.asarray, state) if placement is None else placement.restore_target(state)
    )
    state, data_state = ckpt.restore(latest, target)
    data.train_iter.set_state(data_state)
    logging.info("resumed from step %d in %s", latest, ckpt.directory)
  elif config.init.hf_dir or config.init.upcycle_from:
    state = init_from.initial_state(config, state, optimizer, placement)
    logging.info("starting from the weights in %s", config.init.hf_dir or config.init.upcycle_from)

  train_step = step_lib.make_train_step(
    graphdef, optimizer, config.seed, placement, t.micro_batches, t.balance_statistics, objective
  )
  eval_step = task.make_eval_step(graphdef, placement)
  start = int(state.step)
  # Records past `start` (logged after the restored checkpoint by a killed run) are
  # dropped from metrics.jsonl and hidden in TensorBoard: one record per step.
  writer = MetricWriter(workdir, enabled=write_metrics and is_chief, start_step=start)
  tokens_per_step = config.data.batch_size * task.tokens_per_example(config)
  history, last_eval = [], {}
  progress = _progress_bar(start, t.steps, t.progress_bar and is_chief)
  window_start, window_steps, total_time, total_steps = time.perf_counter(), 0, 0.0, 0
  try:
    last_step = t.steps if stop_at_step is None else min(t.steps, stop_at_step)
    for step in range(start + 1, last_step + 1):
      state, metrics = train_step(state, put(next(data.train_iter)))
      window_steps += 1
      is_log = step % t.log_every == 0 or step == last_step
      is_save = step % t.checkpoint_every == 0 or step == last_step
      is_eval = step % t.eval_every == 0 or step == t.steps
      if not (is_log or is_save or is_eval):
        progress.update(1)
        continue
      record = flatten_metrics(jax.device_get(metrics), moe_layers)
      _check_finite(record["loss"], step, ckpt)
      elapsed = time.perf_counter() - window_start
      total_time, total_steps = total_time + elapsed, total_steps + window_steps
      record["tokens_per_second"] = window_steps * tokens_per_step / max(elapsed, 1e-9)
      if is_eval:
        last_eval = task.evaluate(eval_step, state, data, t.eval_batches, put)
        record.update(last_eval)
      writer.write(step, record)
      history.append({"step": step, **record})
      if is_save:
        ckpt.save(step, state, data.train_iter.get_state(), meta)
      progress.set_postfix(
        loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_second']:.0f}", refresh=False
      )
      progress.update(1)
      window_start, window_steps = time.perf_counter(), 0
  finally:
    progress.close()
    writer.close()
    ckpt.close()
  if write_metrics and is_chief and moe_layers and history:
    plot_expert_load(writer.jsonl_path, os.path.join(workdir, "expert_load.png"))
  return Run(
    state, start, history, last_eval, total_steps * tokens_per_step / max(total_time, 1e-9)
  )


def _progress_bar(start, total, enabled):
  import tqdm

  return tqdm.tqdm(
    initial=start,
    total=total,
    disable=not enabled,
    unit="step",
    dynamic_ncols=True,
    mininterval=1.0,
  )
