"""Greedy predictions on the probes (moejax/evaluation/probes.py) for many members
of one architecture at once: their parameters made inside one jit (RandOpt's
`perturb`) and scored `width` members vmapped at a time (jax.lax.map), a chunk of
members per call.

Two tasks, as the probes score them:
  choice  (next passage): the candidate of highest log-likelihood per UTF-8 byte;
          the prediction is its index.
  greedy  (arithmetic): greedy decoding of as many tokens as the answer has, by full
          forward passes over a right-padded buffer (causal: the padding never reaches
          a real position); the prediction is the decoded tokens (-1 past the answer's
          length), correct when they equal the answer.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.ensembles import randopt
from moejax.evaluation.probes import continuation_row, token_ids


@dataclasses.dataclass(frozen=True)
class Task:
  """Examples encoded for one scoring. choice: rows [R, L] of E examples x C
  candidates, `score` their scored positions, `num_bytes` [E, C], `label` [E]. greedy:
  prompts [E, L] right padded with `length` [E], `answer` [E, T] (-1 padded)."""

  kind: str
  inputs: np.ndarray
  targets: np.ndarray | None
  score: np.ndarray | None
  num_bytes: np.ndarray | None
  length: np.ndarray | None
  answer: np.ndarray  # choice: label [E]; greedy: answer tokens [E, T]


def choice_task(examples, tokenizer, prefix_id: int, context: int) -> Task:
  rows = [
    continuation_row(
      np.concatenate([[prefix_id], token_ids(tokenizer, e.prompt)]),
      token_ids(tokenizer, c),
      context,
    )
    for e in examples
    for c in e.choices
  ]
  width = max(len(r.inputs) for r in rows)

  def pad(xs, v):
    return np.stack([np.pad(x, (0, width - len(x)), constant_values=v) for x in xs])

  k = len(examples[0].choices)
  num_bytes = np.array(
    [[len(c.encode("utf-8")) for c in e.choices] for e in examples], np.float64
  ).reshape(-1, k)
  return Task(
    "choice",
    pad([r.inputs for r in rows], prefix_id),
    pad([r.targets for r in rows], 0),
    pad([r.score for r in rows], False),
    num_bytes,
    None,
    np.array([e.label for e in examples], np.int32),
  )


def greedy_task(examples, tokenizer, prefix_id: int) -> Task:
  prompts = [
    np.concatenate([[prefix_id], tokenizer.encode(e.prompt)]).astype(np.int32) for e in examples
  ]
  answers = [np.asarray(tokenizer.encode(e.choices[0]), np.int32) for e in examples]
  steps = max(len(a) for a in answers)
  width = max(len(p) for p in prompts) + steps
  inputs = np.stack([np.pad(p, (0, width - len(p)), constant_values=prefix_id) for p in prompts])
  answer = np.stack([np.pad(a, (0, steps - len(a)), constant_values=-1) for a in answers])
  return Task(
    "greedy", inputs, None, None, None, np.array([len(p) for p in prompts], np.int32), answer
  )


def _logits(graphdef, params, rest, tokens):
  logits, _, _ = nnx.merge(graphdef, params, rest)(tokens)
  return logits


def _choice(graphdef, params, rest, task: dict, shape):
  logp = jax.nn.log_softmax(_logits(graphdef, params, rest, task["inputs"]).astype(jnp.float32))
  picked = jnp.take_along_axis(logp, task["targets"][..., None], -1)[..., 0]
  total = jnp.where(task["score"], picked, 0.0).sum(-1).reshape(shape)
  return jnp.argmax(total / task["num_bytes"], axis=-1).astype(jnp.int32)


def _greedy(graphdef, params, rest, task: dict, steps: int):
  tokens, length = task["inputs"], task["length"]
  rows = jnp.arange(tokens.shape[0])

  def step(t, buf):
    logits = _logits(graphdef, params, rest, buf)
    nxt = jnp.argmax(logits[rows, length - 1 + t], axis=-1).astype(buf.dtype)
    return buf.at[rows, length + t].set(nxt)

  buf = jax.lax.fori_loop(0, steps, step, tokens)
  return buf[rows[:, None], length[:, None] + jnp.arange(steps)[None]]


def _arrays(task: Task) -> dict:
  names = ("inputs", "targets", "score", "num_bytes", "length")
  return {n: jnp.asarray(getattr(task, n)) for n in names if getattr(task, n) is not None}


@functools.partial(jax.jit, static_argnums=(0, 5, 6, 7))
def _members(graphdef, params, rest, key, indices, statics, width, zero, sigma, arrays):
  def one(index):
    member = params if zero else randopt.perturb(params, key, index, sigma)
    return [
      (_choice if kind == "choice" else _greedy)(graphdef, member, rest, task, static)
      for (kind, static), task in zip(statics, arrays)
    ]

  return jax.lax.map(one, indices, batch_size=width)


def predict(
  graphdef, params, rest, tasks: list[Task], *, key, indices, sigma: float, width: int = 1
):
  """Per task, the predictions [len(indices), E, ...] of members `indices` (numpy),
  `width` members vmapped at a time (jax.lax.map's batch_size; on a CPU a vmapped
  dropless layer is slower than a loop, so 1 there)."""
  statics = tuple(
    (t.kind, np.asarray(t.num_bytes).shape if t.kind == "choice" else t.answer.shape[1])
    for t in tasks
  )
  out = _members(
    graphdef,
    params,
    rest,
    key,
    jnp.asarray(indices, jnp.int32),
    statics,
    int(width),
    float(sigma) == 0.0,
    jnp.float32(sigma),
    [_arrays(t) for t in tasks],
  )
  return [mask_answers(t, np.asarray(p)) for t, p in zip(tasks, out)]


def mask_answers(task: Task, predictions: np.ndarray) -> np.ndarray:
  """Greedy predictions cut to each answer's length (-1 beyond it); choice unchanged."""
  if task.kind == "choice":
    return predictions
  return np.where(task.answer[None] >= 0, predictions, -1)


def correct(task: Task, predictions: np.ndarray) -> np.ndarray:
  """bool [..., E]: whether each prediction is the right answer."""
  if task.kind == "choice":
    return predictions == task.answer
  return np.all(predictions == task.answer, axis=-1)
