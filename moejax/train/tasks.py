"""What a run trains on (config `task`): the data it reads and how it is evaluated.

The train step is the same for every task (moejax/train/step.py): the batch's
'inputs' go through the model, its logits meet 'targets' in the mean
cross-entropy, and the MoE layers' weighted router losses are added.

  lm              packed token windows (moejax/data/pipeline.py); logits [B, L, V]
                  against the next tokens; eval: val_loss (nats per token) and
                  val_bpb (bits per byte).
  classification  image batches (moejax/data/vision.py); logits [B, C] against the
                  labels; eval over the whole eval split, each example once
                  (padding weighted 0): val_loss (mean cross-entropy, nats) and
                  val_accuracy (fraction of argmax hits).
  distill         lm's data (mix rows labelled with their domain) and evaluation;
                  the loss adds a distillation term from a frozen teacher
                  (moejax/train/distill.py: config section `distill`).
"""

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from moejax.data.pipeline import build_lm_data
from moejax.data.vision import build_image_data
from moejax.models.vit import num_tokens
from moejax.train import distill
from moejax.train import step as step_lib


@dataclasses.dataclass(frozen=True)
class Task:
  """build_data(data cfg, *, seed, shard_index, shard_count) -> the run's data;
  make_eval_step(graphdef, placement) -> eval step; evaluate(eval_step, state, data,
  num_batches, put) -> {metric: float}; tokens_per_example(config) -> tokens the
  model sees per example (the loop's throughput); prepare(config, mesh layout or
  None), if given, checks the task's own sources before any data is read and returns
  attach(data) -> (data, objective), objective the task's term of the train step's
  loss (moejax/train/step.py make_loss_fn)."""

  build_data: Callable
  make_eval_step: Callable
  evaluate: Callable
  tokens_per_example: Callable
  prepare: Callable | None = None


def evaluate_lm(eval_step, state, data, num_batches, put=lambda batch: batch) -> dict:
  """val_loss (mean over the first num_batches eval batches) and val_bpb."""
  losses = [
    float(eval_step(state.params, state.rest, put(batch))[0])
    for batch in data.eval_batches(num_batches)
  ]
  val_loss = float(np.mean(losses))
  return {"val_loss": val_loss, "val_bpb": val_loss / math.log(2) / data.bytes_per_token}


def classification_sums(logits_BxC, batch) -> dict:
  """Weighted sums over the batch: cross-entropy, correct argmax, examples (float32)."""
  weights = batch["weights"].astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(
    logits_BxC.astype(jnp.float32), batch["targets"]
  )
  correct = (jnp.argmax(logits_BxC, axis=-1) == batch["targets"]).astype(jnp.float32)
  return {
    "ce": jnp.sum(weights * ce),
    "correct": jnp.sum(weights * correct),
    "count": jnp.sum(weights),
  }


def evaluate_classification(eval_step, state, data, num_batches, put=lambda batch: batch) -> dict:
  """val_loss and val_accuracy over the eval batches (every example once: ImageData)."""
  sums = [
    jax.device_get(eval_step(state.params, state.rest, put(batch))[0])
    for batch in data.eval_batches(num_batches)
  ]
  total = {key: sum(float(s[key]) for s in sums) for key in sums[0]}
  return {
    "val_loss": total["ce"] / total["count"],
    "val_accuracy": total["correct"] / total["count"],
  }


TASKS = {
  "lm": Task(
    build_lm_data, step_lib.make_eval_step, evaluate_lm, lambda config: config.data.seq_len
  ),
  "distill": Task(
    functools.partial(build_lm_data, label_domains=True),
    step_lib.make_eval_step,
    evaluate_lm,
    lambda config: config.data.seq_len,
    distill.prepare,
  ),
  "classification": Task(
    build_image_data,
    lambda graphdef, placement=None: step_lib.make_eval_step(
      graphdef, placement, score=classification_sums
    ),
    evaluate_classification,
    lambda config: num_tokens(config.model),
  ),
}


def task_of(config) -> Task:
  """The Task of `config.task` ('lm' for configs saved before the key existed)."""
  return TASKS[config.get("task", "lm")]
