"""Accuracy probes scored from model log-likelihoods.

An Example is a prompt, its candidate continuations and the index of the
right one. Two scorings, both teacher forced:
  greedy  (fact recall, arithmetic, last word): one continuation; correct when
          the argmax token equals the continuation's token at every position,
          which is exactly "greedy decoding of len(continuation) tokens
          reproduces it".
  choice  (next passage): the candidate with the highest log-likelihood per
          UTF-8 byte of the candidate (normalize="bytes", the default; it
          does not favour short candidates and does not depend on the
          tokenizer) or in total (normalize="none"); ties go to the first.
Prompt and continuation are encoded separately and joined ([prefix_id] +
prompt + continuation), as the byte tokenizer would; a prompt longer than the
context loses its oldest tokens.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np

from moejax.errors import ConfigError, choice_error
from moejax.evaluation.model import LM, Row, score_rows

NORMALIZE = ("bytes", "none")
SCORINGS = ("greedy", "choice")


@dataclasses.dataclass(frozen=True)
class Example:
  prompt: str
  choices: tuple[str, ...]
  label: int = 0
  group: str = "all"


def token_ids(tokenizer, text: str) -> np.ndarray:
  """int32 [N]: `text` encoded by `tokenizer`."""
  return np.asarray(tokenizer.encode(text), np.int32)


def continuation_row(prompt: np.ndarray, continuation: np.ndarray, context: int) -> Row:
  """A row scoring `continuation` after `prompt` (prompt cut from the left to fit)."""
  if not 1 <= len(continuation) <= context:
    raise ConfigError(
      f"a continuation of {len(continuation)} tokens does not fit the context of {context}"
    )
  seq = np.concatenate([prompt, continuation]).astype(np.int32)[-(context + 1) :]
  score = np.arange(len(seq) - 1) >= len(seq) - 1 - len(continuation)
  return Row(seq[:-1], seq[1:], score)


def score_continuations(
  lm: LM,
  tokenizer,
  prefix_id: int,
  pairs: Sequence[tuple[str, str]],
  *,
  context: int,
  batch_size: int = 8,
):
  """(total log-likelihood float64 [N], greedy match bool [N]) of each (prompt, continuation)."""
  rows = [
    continuation_row(
      np.concatenate([[prefix_id], token_ids(tokenizer, p)]), token_ids(tokenizer, c), context
    )
    for p, c in pairs
  ]
  scored = score_rows(lm, rows, context, batch_size, pad_id=prefix_id)
  return (
    np.array([s.logprob.sum() for s in scored], np.float64),
    np.array([bool(s.correct.all()) for s in scored], bool),
  )


def choose(logprob: np.ndarray, num_bytes: np.ndarray, normalize: str = "bytes") -> np.ndarray:
  """int [N]: the chosen candidate of each row of log-likelihoods [N, K]."""
  if normalize not in NORMALIZE:
    raise choice_error("normalize", normalize, NORMALIZE)
  score = logprob / num_bytes if normalize == "bytes" else logprob
  return np.argmax(score, axis=1)


def accuracy_by_group(correct: np.ndarray, groups: Sequence[str]) -> dict[str, dict]:
  """{group: {"accuracy" (None when n is 0), "n"}, ..., "all": ...}."""
  correct, group_of = np.asarray(correct, bool), np.asarray(groups)
  out = {}
  for group in sorted(set(group_of.tolist()) - {"all"}) + ["all"]:
    pick = correct if group == "all" else correct[group_of == group]
    out[group] = {"accuracy": float(pick.mean()) if pick.size else None, "n": int(pick.size)}
  return out


def probe_correct(
  lm: LM,
  tokenizer,
  prefix_id: int,
  examples: Sequence[Example],
  scoring: str,
  *,
  context: int,
  batch_size: int = 8,
  normalize: str = "bytes",
) -> np.ndarray:
  """bool [N]: whether the model gets each example right under `scoring` (module doc)."""
  if scoring not in SCORINGS:
    raise choice_error("scoring", scoring, SCORINGS)
  if not examples:
    return np.zeros(0, bool)
  if scoring == "greedy":
    if any(len(e.choices) != 1 for e in examples):
      raise ConfigError("greedy scoring takes examples with exactly one continuation")
    _, greedy = score_continuations(
      lm,
      tokenizer,
      prefix_id,
      [(e.prompt, e.choices[0]) for e in examples],
      context=context,
      batch_size=batch_size,
    )
    return greedy
  widths = {len(e.choices) for e in examples}
  if len(widths) != 1:
    raise ConfigError(
      f"choice scoring needs the same number of candidates per example, found {sorted(widths)}"
    )
  k = widths.pop()
  pairs = [(e.prompt, c) for e in examples for c in e.choices]
  logprob, _ = score_continuations(
    lm, tokenizer, prefix_id, pairs, context=context, batch_size=batch_size
  )
  num_bytes = np.array([len(c.encode("utf-8")) for _, c in pairs], np.float64)
  chosen = choose(logprob.reshape(-1, k), num_bytes.reshape(-1, k), normalize)
  return chosen == np.array([e.label for e in examples])
