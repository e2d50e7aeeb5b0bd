"""Short fine-tuning runs from one base model on mixtures of its corpus's domains, in
memory: MergeMix's domain experts and trained data mixtures (arXiv 2601.17858: every
run from the shared base, a constant learning rate, a short horizon) and the
often-checkpointed experts of arXiv 2506.14126.

Data (`DomainData`, from a training workdir of a corpus with a `domain` feature,
the mix corpus):
  train     per domain, the training split's documents as one token stream, each
            followed by the end-of-document token
  held_out  per domain, int32 [n, seq_len + 1] windows of the eval split's first
            `bytes_per_domain` bytes (evaluation/bpb.domain_windows: the domain's
            documents as one stream, each after the separator, cut into whole windows)

Batches:
  mixture_batches  S steps of B rows: row r goes to a domain by smooth weighted round
                   robin over the mixture alpha (after r rows each domain holds
                   within one row of alpha_k r), and domain k's rows read, in order,
                   the windows of its stream at offsets drawn with seed 1000 seed + k
                   (posttrain/calibration.calibration_windows). The one-hot mixture
                   e_k therefore reads exactly the batches of the expert on domain k,
                   and the mixtures of one seed share each domain's windows up to
                   their counts.
  pool_batches     S steps of B rows cycling over a fixed pool of windows, a fresh
                   permutation each epoch (seeded): many epochs over a small set, the
                   overtraining regime.

Training (`Finetuner`): the run config's optimizer (train/optimizer.make_optimizer:
AdamW after global-norm clipping) at a constant learning rate after a linear warmup,
and the trainer's own step (train/step.train_step_fn), jitted once for every run of
the same shapes; each run starts from the base with a fresh optimizer state and
returns host copies of its parameters at the steps asked for.

Scoring (`window_nats`): per window, the mean next-token loss in nats over its
seq_len targets, by the trainer's eval step (train/step.make_eval_step) compiled once
per model.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from moejax.errors import ConfigError
from moejax.posttrain.calibration import calibration_windows

SEED_STRIDE = 1000  # domain k of seed s draws its windows with seed SEED_STRIDE * s + k


@dataclasses.dataclass
class DomainData:
  """A workdir's corpus by domain: train streams and held-out windows (module doc)."""

  domains: tuple[str, ...]  # the corpus's domains, in split order
  train: dict  # {domain: int32 stream}
  held_out: dict  # {domain: int32 [n, seq_len + 1]}
  seq_len: int
  eos_id: int


def domain_data(source, bytes_per_domain: int, domains=None, seq_len=None) -> DomainData:
  """The DomainData of a training Source (posttrain/source.load_training) with windows
  of seq_len + 1 tokens (default: the run's seq_len); ConfigError when one of
  `domains` (default: all) has fewer than two held-out windows."""
  from moejax.data.packing import pack_documents
  from moejax.data.pipeline import split_documents
  from moejax.evaluation import bpb, harness

  config, tokenizer = source.config, source.tokenizer
  seq_len, eos = int(seq_len or config.data.seq_len), int(tokenizer.eos_id)
  texts: dict[str, list] = {}
  for domain, text in split_documents(config.data, "train_split"):
    texts.setdefault(domain, []).append(text)
  train = {d: pack_documents(map(tokenizer.encode, t), eos) for d, t in texts.items()}
  documents = harness.sample_documents(split_documents(config.data), bytes_per_domain)
  windows, counts = bpb.domain_windows(documents, tokenizer, eos, seq_len + 1)
  held_out, start = {}, 0
  for domain, n in counts.items():
    held_out[domain] = windows[start : start + n]
    start += n
  few = [d for d in (train if domains is None else domains) if len(held_out.get(d, ())) < 2]
  if few:
    raise ConfigError(
      f"bytes_per_domain={bytes_per_domain} gives domain {few[0]!r} fewer than 2 held-out "
      f"windows of {seq_len + 1} tokens (one to select on, one to test)"
    )
  return DomainData(tuple(train), train, held_out, seq_len, eos)


def round_robin(alpha, rows: int) -> np.ndarray:
  """int [rows]: the domain of each row by smooth weighted round robin over alpha
  (each step adds alpha to a running credit and gives the row to the largest credit,
  ties to the first, which then pays 1): a domain of weight 0 gets no row."""
  alpha = np.asarray(alpha, np.float64)
  credit, out = np.zeros_like(alpha), np.empty(rows, np.int64)
  for r in range(rows):
    credit += alpha
    out[r] = int(np.argmax(credit))
    credit[out[r]] -= 1.0
  return out


def mixture_batches(
  streams: list, alpha, steps: int, batch: int, seq_len: int, seed: int
) -> np.ndarray:
  """int32 [steps, batch, seq_len + 1]: the training windows of mixture alpha over the
  domain `streams` (module doc)."""
  owner = round_robin(alpha, steps * batch)
  rows = np.empty((steps * batch, seq_len + 1), np.int32)
  for k, stream in enumerate(streams):
    mine = np.flatnonzero(owner == k)
    if mine.size:
      drawn = calibration_windows(stream, steps * batch, seq_len + 1, SEED_STRIDE * seed + k)
      rows[mine] = drawn[: mine.size]
  return rows.reshape(steps, batch, seq_len + 1)


def pool_batches(pool: np.ndarray, steps: int, batch: int, seed: int) -> np.ndarray:
  """int32 [steps, batch, L]: rows cycling over `pool` [P, L], each epoch a fresh
  permutation from numpy default_rng(seed)."""
  rng = np.random.default_rng(seed)
  epochs = -(-steps * batch // len(pool))
  order = np.concatenate([rng.permutation(len(pool)) for _ in range(epochs)])
  return np.asarray(pool)[order[: steps * batch]].reshape(steps, batch, -1)


class Finetuner:
  """Fine-tuning runs of one model from its base parameters (module doc)."""

  def __init__(self, graphdef, train_config, *, learning_rate: float, warmup: int):
    from moejax.train.optimizer import make_optimizer
    from moejax.train.step import train_step_fn

    t = ml_collections.ConfigDict(train_config.to_dict())
    t.learning_rate, t.warmup_steps, t.min_lr_ratio = float(learning_rate), int(warmup), 1.0
    t.steps = int(warmup) + 1  # with min_lr_ratio 1 the cosine part is constant
    self.optimizer = make_optimizer(t)
    step = train_step_fn(graphdef, self.optimizer, 1, t.get("balance_statistics", "step"))
    self._step = jax.jit(step, donate_argnums=0)

  def run(self, params: dict, rest: dict, batches: np.ndarray, seed: int, snapshot_at=()) -> dict:
    """{step: (host params, host rest)} after each step in `snapshot_at` (and the
    last), training from (params, rest) on `batches` [S, B, L + 1]; step t's key is
    fold_in(key(seed), t), as the trainer's."""
    from moejax.train.step import TrainState

    # Copies: the step donates its state, which must not alias the caller's arrays.
    params, rest = jax.tree.map(lambda x: jnp.array(x, copy=True), (params, rest))
    state = TrainState(jnp.int32(0), params, rest, self.optimizer.init(params))
    key, wanted, out = jax.random.key(seed), set(snapshot_at) | {len(batches)}, {}
    for s, rows in enumerate(batches, start=1):
      rows = jnp.asarray(rows)
      state, _ = self._step(state, {"inputs": rows[:, :-1], "targets": rows[:, 1:]}, key)
      if s in wanted:
        out[s] = jax.tree.map(np.asarray, jax.device_get((state.params, state.rest)))
    return out


def _row_nats(logits, batch):
  """Per row, the mean next-token cross-entropy in nats (float32)."""
  return jnp.mean(
    optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"]),
    axis=-1,
  )


@functools.lru_cache(maxsize=8)
def row_loss_step(graphdef):
  """The trainer's jitted eval step (train/step.make_eval_step) scoring each row."""
  from moejax.train.step import make_eval_step

  return make_eval_step(graphdef, score=_row_nats)


def window_nats(graphdef, params: dict, rest: dict, windows: np.ndarray, batch_size: int = 32):
  """float64 [n]: each window's mean next-token loss in nats (windows [n, L + 1]), in
  batches of `batch_size` rows (the last padded with row 0: one compilation)."""
  windows = np.asarray(windows, np.int32)
  step, out = row_loss_step(graphdef), []
  for start in range(0, len(windows), batch_size):
    chunk = windows[start : start + batch_size]
    rows = np.concatenate([chunk, np.repeat(windows[:1], batch_size - len(chunk), 0)])
    batch = {"inputs": jnp.asarray(rows[:, :-1]), "targets": jnp.asarray(rows[:, 1:])}
    out.append(np.asarray(step(params, rest, batch)[0], np.float64)[: len(chunk)])
  return np.concatenate(out) if out else np.zeros(0)
