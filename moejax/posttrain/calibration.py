"""Calibration for post-training (pruning and compression): the token windows of
one calibration draw and every statistic a method reads from them, each
computed once, on first use.

Windows: `num_windows` windows of `context` tokens at offsets drawn uniformly
with `seed` from a token stream (a training split, or a calibration file,
`calibration_stream`), so seeds 0..N-1 give N independent calibration draws.

Statistics (`Calibration`), all from the same windows in batches of `batch_size`:
  stats        per MoE layer the Gram of routed expert contributions, frequency and
               router mass (contributions.layer_statistics; SCHUR-A*, greedy, the
               rankings), with Step's token-selective scores once asked for
               (`with_step_scores`, taylor.layer_step_scores)
  atom_sums    HEAPr's per-atom sums (atoms.atom_sums)
  inputs       the routed inputs of every expert (expert_inputs.capture; GPTQ,
               CodeQuant's centroid fine-tuning, TD-MoE's whitening)
  costs        GEMQ's Fisher-weighted costs per bit choices (gemq.expert_costs)
"""

from __future__ import annotations

import functools

import numpy as np

from moejax.errors import ConfigError

STEP_RHO = 0.25  # Step: the fraction of calibration tokens kept by loss (a guess)


def calibration_windows(
  stream: np.ndarray, num_windows: int, context: int, seed: int, source: str = "the training split"
) -> np.ndarray:
  """int32 [num_windows, context]: windows at offsets drawn uniformly with `seed`;
  `source` names the stream in the refusal of one too short ("--calibration=FILE")."""
  if len(stream) < context + 1:
    raise ConfigError(
      f"{source} has {len(stream)} tokens, fewer than one calibration window of {context} plus one"
    )
  starts = np.random.default_rng(seed).integers(0, len(stream) - context + 1, num_windows)
  return np.stack([stream[s : s + context] for s in starts]).astype(np.int32)


class Calibration:
  """One calibration draw of the model config `m` (loop layout) with host `params`
  and `rest`: its windows [N, L] and their statistics (module doc)."""

  def __init__(self, m, params: dict, rest: dict, windows: np.ndarray, batch_size: int = 8):
    from moejax.models.decoder import abstract_model

    self.model = m
    self.graphdef = abstract_model(m)[0]
    self.params, self.rest = params, rest
    self.windows = np.asarray(windows)
    self.batches = [
      self.windows[i : i + batch_size] for i in range(0, len(self.windows), batch_size)
    ]
    self._costs: dict = {}

  @functools.cached_property
  def stats(self) -> list:
    from moejax.posttrain import contributions

    return contributions.layer_statistics(self.graphdef, self.params, self.rest, self.batches)

  def with_step_scores(self) -> list:
    """`stats` with each layer's Step scores (computed on the first call)."""
    if self.stats[0].step_score is None:
      from moejax.posttrain import taylor

      scores = taylor.layer_step_scores(
        self.graphdef, self.params, self.rest, self.batches, STEP_RHO
      )
      for layer, score in zip(self.stats, scores):
        layer.step_score = score
    return self.stats

  @functools.cached_property
  def atom_sums(self) -> dict:
    from moejax.posttrain import atoms

    return atoms.atom_sums(self.graphdef, self.params, self.rest, self.batches)

  @functools.cached_property
  def inputs(self) -> list:
    from moejax.posttrain import expert_inputs

    return expert_inputs.capture(self.graphdef, self.params, self.rest, self.batches)

  def costs(self, bits: tuple, group_size: int, current: dict | None = None):
    """(blocks, c [blocks, E, len(bits)]) of gemq.expert_costs: the float model,
    or with `current` (params of the quantized model) each candidate placed in it."""
    from moejax.posttrain import gemq

    if current is not None:
      return gemq.expert_costs(
        self.graphdef, current, self.rest, self.batches, bits, group_size, source_params=self.params
      )
    key = (tuple(bits), group_size)
    if key not in self._costs:
      self._costs[key] = gemq.expert_costs(
        self.graphdef, self.params, self.rest, self.batches, bits, group_size
      )
    return self._costs[key]


def calibration_stream(
  path: str, tokenizer, eos_id: int | None, vocab_size: int | None = None
) -> np.ndarray:
  """Calibration tokens from a file: a .npy array of token ids (any shape, read
  flat), or a .jsonl file of {"text": ...} lines tokenized with the model's own
  tokenizer, each document followed by its eos id. Every id must lie in
  [0, vocab_size) (when given); every document must encode to at least one token."""
  from moejax import cli_files

  cli_files.input_file("calibration", path)
  where = f"(--calibration={path})"
  if path.endswith(".npy"):
    try:
      ids = np.load(path)
    except ValueError as e:
      raise ConfigError(f"cannot read token ids: {e} {where}") from None
    if not np.issubdtype(ids.dtype, np.integer):
      raise ConfigError(f"token ids must be integers, got {ids.dtype} {where}")
    return _in_vocabulary(ids.reshape(-1).astype(np.int64), vocab_size, where).astype(np.int32)
  if not path.endswith(".jsonl"):
    raise ConfigError(f"expected a .npy file of token ids or a .jsonl file of texts {where}")
  if tokenizer is None:
    raise ConfigError(
      f"the model has no tokenizer (tokenizer.json) to read texts with; "
      f"give token ids as .npy {where}"
    )
  parts = []
  for line_where, record in cli_files.json_lines("calibration", path, ("text",)):
    ids = np.asarray(tokenizer.encode(record["text"]), np.int64)
    if not ids.size:
      raise ConfigError(f"the text encodes to no tokens {line_where}")
    parts.append(_in_vocabulary(ids, vocab_size, line_where))
    if eos_id is not None:
      parts.append(np.array([eos_id], np.int64))
  return (np.concatenate(parts) if parts else np.zeros(0, np.int64)).astype(np.int32)


def _in_vocabulary(ids: np.ndarray, vocab_size: int | None, where: str) -> np.ndarray:
  """`ids` (int64), refused naming the first id outside [0, vocab_size)."""
  bad = ids[(ids < 0) | (ids >= vocab_size if vocab_size is not None else False)]
  if bad.size:
    bound = "" if vocab_size is None else f", {vocab_size}"
    raise ConfigError(f"token id {int(bad[0])} is outside the vocabulary [0{bound}) {where}")
  return ids
