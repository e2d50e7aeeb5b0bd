"""The model interface of the harness, and rows of tokens scored in batches.

An LM is a callable lm(inputs [B, L] int32, targets [B, L] int32, mask [B, L]
bool) -> TokenScores: log p(target | inputs up to it) (natural log), the
argmax token at every position, and per MoE layer the experts of every
input token ([B, L, S], -1 for an invalid slot). `DecoderLM` wraps the one
Decoder; `LogitsLM` wraps any function returning logits (hand-written
models in tests).
"""

import dataclasses
import functools
from typing import Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.models.decoder import abstract_model


@dataclasses.dataclass
class TokenScores:
  logprob: np.ndarray  # float32 [B, L]: log p(targets[b, l])
  argmax: np.ndarray  # int32 [B, L]: the likeliest next token
  routing: list  # per MoE layer int32 [B, L, S]: expert of each slot, -1 = none


class LM(Protocol):
  vocab_size: int

  def __call__(self, inputs: np.ndarray, targets: np.ndarray, mask: np.ndarray) -> TokenScores: ...


@dataclasses.dataclass
class LogitsLM:
  """An LM from fn(inputs [B, L]) -> logits [B, L, V]; log-softmax in float64."""

  fn: Callable[[np.ndarray], np.ndarray]
  vocab_size: int

  def __call__(self, inputs, targets, mask) -> TokenScores:
    del mask
    logits = np.asarray(self.fn(inputs), np.float64)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    return TokenScores(picked, logits.argmax(-1).astype(np.int32), [])


@functools.partial(jax.jit, static_argnums=0)
def _decoder_forward(graphdef, params, rest, inputs, targets, mask):
  """(log p(targets), argmax, routing per MoE layer) of one batch of rows."""
  logits, aux, _ = nnx.merge(graphdef, params, rest)(inputs, token_mask_BxL=mask)
  logp = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
  b, length = inputs.shape
  routing = [
    jnp.where(a["valid"], a["expert_index"], -1).reshape(b, length, -1) for a in aux["moe"]
  ]
  return picked, jnp.argmax(logits, -1).astype(jnp.int32), routing


class DecoderLM:
  """The Decoder of (model config, params, rest) as an LM; compiled once per
  architecture and shape (a reference of the same architecture reuses it)."""

  def __init__(self, m, params, rest):
    self._graphdef, _, _ = abstract_model(m)
    self.vocab_size, self.max_seq_len = m.vocab_size, m.max_seq_len
    self._params, self._rest = params, rest

  def __call__(self, inputs, targets, mask) -> TokenScores:
    picked, argmax, routing = jax.device_get(
      _decoder_forward(
        self._graphdef,
        self._params,
        self._rest,
        jnp.asarray(inputs, jnp.int32),
        jnp.asarray(targets, jnp.int32),
        jnp.asarray(mask, bool),
      )
    )
    return TokenScores(picked, argmax, list(routing))


@dataclasses.dataclass
class Row:
  """One model row: inputs and targets (same length), scored where `score` is set."""

  inputs: np.ndarray
  targets: np.ndarray
  score: np.ndarray  # bool


@dataclasses.dataclass
class RowScores:
  logprob: np.ndarray  # float64 [n]: the scored targets' log-probabilities
  correct: np.ndarray  # bool [n]: target == argmax
  routing: list  # per MoE layer int32 [n, S]


def score_rows(
  lm: LM, rows: list[Row], width: int, batch_size: int, pad_id: int = 0
) -> list[RowScores]:
  """Every row's scored positions, rows run in batches of [batch_size, width].

  Rows are right padded (mask marks real tokens); the last batch is filled
  with one-token rows, so every call has one shape (one compilation)."""
  out = []
  for start in range(0, len(rows), batch_size):
    chunk = rows[start : start + batch_size]
    inputs = np.full((batch_size, width), pad_id, np.int32)
    targets = np.zeros((batch_size, width), np.int32)
    mask = np.zeros((batch_size, width), bool)
    mask[:, 0] = True
    for i, row in enumerate(chunk):
      n = len(row.inputs)
      if n > width or len(row.targets) != n or len(row.score) != n:
        raise ValueError(
          f"row of {n} inputs, {len(row.targets)} targets, {len(row.score)} "
          f"flags does not fit width {width}"
        )
      inputs[i, :n], targets[i, :n], mask[i, :n] = row.inputs, row.targets, True
    scores = lm(inputs, targets, mask)
    for i, row in enumerate(chunk):
      keep = np.zeros(width, bool)
      keep[: len(row.score)] = row.score
      out.append(
        RowScores(
          np.asarray(scores.logprob[i][keep], np.float64),
          scores.argmax[i][keep] == targets[i][keep],
          [np.asarray(r[i][keep]) for r in scores.routing],
        )
      )
  return out
