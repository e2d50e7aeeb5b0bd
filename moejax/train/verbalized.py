"""Fine-tuning an upcycled decoder LM to classify passages through its own output layer.

`upcycled_model` turns a restored dense checkpoint into an MoE (model.ffn_type
'moe', the model.moe keys given) by sparse upcycling (moejax/train/upcycle.py):
every expert, and a merged layer's base expert, starts as the layer's dense FFN.

`finetune` trains all its parameters with Adam for a fixed number of steps on
passages and scores held-out ones. A passage's class logits are the model's
next-token logits after its last token, restricted to one token per class
(`label_tokens`, a verbalizer): no new head, so the fine-tuning starts from the
pretrained output layer. Loss: the mean cross-entropy over those logits; each step
draws `batch_size` distinct training passages with the seed's generator, so two
runs of one seed see the same batches whatever the model.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from moejax.train.build import build_model
from moejax.train.step import split_model
from moejax.train.upcycle import upcycle_params
from moejax.validation import validate_config


EVAL_ROWS = 120  # held-out passages per forward pass


@dataclasses.dataclass(frozen=True)
class Finetuning:
  """Full fine-tuning with Adam: `steps` batches of `batch_size` passages drawn by `seed`."""

  steps: int
  batch_size: int
  learning_rate: float
  seed: int


def upcycled_model(dense, moe: dict, seed: int):
  """(model config, graphdef, params, rest) of the dense model `dense` (a
  moejax.train.restore.Restored checkpoint) upcycled into an MoE whose model.moe takes
  `moe` ({dotted key under model.moe: value}); routers start from `seed`."""
  config = ml_collections.ConfigDict(dense.config.to_dict())
  config.model.ffn_type, config.seed = "moe", seed
  for dotted, value in moe.items():
    *parents, name = dotted.split(".")
    section = config.model.moe
    for part in parents:
      section = section[part]
    section[name] = value
  validate_config(config)
  graphdef, params, rest = split_model(build_model(config))
  params = upcycle_params(dense.params, jax.tree.map(np.asarray, params), config.model.moe.top_k)
  return config.model, graphdef, params, rest


def class_logits(graphdef, params, rest, tokens, label_tokens):
  """[B, K]: the next-token logits after each passage of the tokens of the K classes."""
  logits, _, _ = nnx.merge(graphdef, params, rest)(tokens, last_logits_only=True)
  return logits[:, -1][:, label_tokens]


@functools.partial(jax.jit, static_argnames=("graphdef", "learning_rate"))
def train_step(graphdef, learning_rate, params, rest, opt_state, tokens, labels, label_tokens):
  """One Adam step on the mean class cross-entropy: (params, opt_state, loss)."""

  def loss(params):
    logits = class_logits(graphdef, params, rest, tokens, label_tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  value, grads = jax.value_and_grad(loss)(params)
  updates, opt_state = optax.adam(learning_rate).update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, value


score = jax.jit(class_logits, static_argnames="graphdef")


def finetune(graphdef, params, rest, train, test, label_tokens, run: Finetuning) -> dict:
  """{"accuracy", "test_loss", "train_loss"} after `run.steps` Adam steps on the
  passages train = (tokens [N, L], labels [N]), scored on every passage of `test`
  (train_loss: the mean over the last tenth of the steps). The steps compile once
  per model structure (graphdef) and learning rate."""
  label_tokens = jnp.asarray(label_tokens, jnp.int32)
  params = jax.tree.map(jnp.asarray, params)
  opt_state = optax.adam(run.learning_rate).init(params)
  rng = np.random.default_rng(run.seed)
  tokens, labels = train
  losses = []
  for _ in range(run.steps):
    rows = rng.choice(len(labels), run.batch_size, replace=False)
    params, opt_state, value = train_step(
      graphdef, run.learning_rate, params, rest, opt_state, tokens[rows], labels[rows], label_tokens
    )
    losses.append(value)
  test_tokens, test_labels = test
  pad = -len(test_labels) % EVAL_ROWS  # equal chunks: one compilation
  padded = np.pad(test_tokens, ((0, pad), (0, 0)), mode="edge")
  chunks = range(0, len(padded), EVAL_ROWS)
  logits = np.concatenate(
    [
      np.asarray(score(graphdef, params, rest, padded[i : i + EVAL_ROWS], label_tokens))
      for i in chunks
    ]
  )[: len(test_labels)].astype(np.float64)
  test_loss = optax.softmax_cross_entropy_with_integer_labels(logits, test_labels).mean()
  tail = max(1, run.steps // 10)
  return {
    "accuracy": float(np.mean(np.argmax(logits, -1) == test_labels)),
    "test_loss": float(test_loss),
    "train_loss": float(np.mean(jax.device_get(losses[-tail:]))),
  }
