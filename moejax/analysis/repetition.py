"""RepetitionCurse (arXiv 2512.23995): one token repeated makes every position
route to the same experts, and expert parallelism waits for the busiest device.

With no BOS token, a prompt of one token repeated N times gives the same
hidden state at every position of every layer: causal attention averages
identical values (RoPE changes the weights, not the values), so each layer's
router sees N copies of one vector and picks one top-k set N times. The paper
measures prefill latency (TTFT) under expert parallelism, which follows the
device holding the most routed rows.

Here, per MoE layer, on the model's own routing:
  same_set_fraction  positions whose top-k set is their row's most common set
  max_over_mean_load the busiest expert's routed tokens over the mean per expert
  busiest_device     the latency model: experts split in contiguous blocks over
                     `expert_shards` devices (as moejax's expert axis splits
                     them), tokens in `token_groups` contiguous groups (the batch
                     axes); a device processes the rows of its expert block from
                     its token group, and prefill waits for the largest count.
                     Reported over the balanced count (all rows / devices).
The defence the paper discusses, capacity-aware dropping, caps every expert at
C = dispatch.capacity.expert_capacity(...) rows, so the busiest device holds at
most C x (experts per device) rows whatever the prompt (`capped_load`); its cost is
the fraction of routed slots it drops (`drop_rate`), on benign text too.
Time to first token (the paper's headline), simulated: prefill runs the MoE layers
one after another and each waits for its busiest device, so
    TTFT_sim = sum over MoE layers l of max over devices d of rows_{l,d}
(rows: routed token-slots of d's experts, `expert_shards` devices, one token group);
`ttft_over_balanced` divides it by sum_l rows_l / devices, the perfectly balanced
prefill. Guesses: rows only (no all-to-all, attention or dense time), one row = one
unit of time on every device.

An identity, not a finding: position t's hidden state equals position 0's in every
layer when tokens[0..t] are all one token (causal attention averages identical values),
so a prompt of one repeated token with no BOS has same_set_fraction 1 by construction.
`forced_identical` counts such positions; attack_prompts adds what breaks it (a BOS or
text prefix, a multi-token repeated pattern, a chat-style wrapper), and the figures are
read over the repeated span only (`span`).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from moejax.models.capture import captured_forward


@functools.partial(jax.jit, static_argnums=0)
def routing_of(graphdef, params, rest, tokens):
  """Per MoE layer, (expert_index [B*L, K], valid [B*L, K]) of the model on tokens [B, L]."""
  model = nnx.merge(graphdef, params, rest)
  _, aux, _ = captured_forward(model, tokens)
  return [(layer["expert_index"], layer["valid"]) for layer in aux["moe"]]


def attack_prompts(
  ids, length: int, *, prefix=(), pattern: int = 1, chat=((), ())
) -> tuple[np.ndarray, slice]:
  """(int32 [len(ids) // pattern, length] prompts, the repeated span's positions):
  row i is prefix + chat[0] + the unit ids[i p:(i + 1) p] repeated (cut to fill) +
  chat[1], p = pattern. prefix: token ids before everything (a BOS id, or a text
  prefix's tokens); chat: the (opening, closing) ids of a chat-style turn."""
  ids, prefix = [int(i) for i in ids], [int(i) for i in prefix]
  opening, closing = [int(i) for i in chat[0]], [int(i) for i in chat[1]]
  start, body = len(prefix) + len(opening), length - len(prefix) - len(opening) - len(closing)
  if pattern < 1 or len(ids) < pattern or len(ids) % pattern:
    raise ValueError(f"{len(ids)} ids do not make units of pattern={pattern}")
  if body < pattern:
    raise ValueError(f"length={length} leaves {body} positions for a unit of {pattern}")
  rows = [
    prefix + opening + (ids[i : i + pattern] * (body // pattern + 1))[:body] + closing
    for i in range(0, len(ids), pattern)
  ]
  return np.asarray(rows, np.int32), slice(start, start + body)


def forced_identical(tokens_BxL) -> float:
  """Fraction of positions whose hidden states equal position 0's by construction:
  those t with tokens[0..t] all equal (module doc)."""
  tokens = np.asarray(tokens_BxL)
  same = np.cumprod(tokens == tokens[:, :1], axis=1)
  return float(same[:, 1:].mean()) if tokens.shape[1] > 1 else 1.0


def same_set_fraction(expert_index_BxLxK: np.ndarray, span: slice = slice(None)) -> float:
  """Mean over rows of the fraction of positions (in `span`) whose top-k set (order
  ignored) is the row's most common one there."""
  fractions = []
  for row in np.asarray(expert_index_BxLxK)[:, span]:
    sets = [tuple(sorted(s)) for s in row.tolist()]
    fractions.append(max(sets.count(s) for s in set(sets)) / len(sets))
  return float(np.mean(fractions))


def expert_load(expert_index, valid, num_experts: int) -> np.ndarray:
  """Routed (valid) slots per expert."""
  index = np.asarray(expert_index).reshape(-1)
  return np.bincount(index[np.asarray(valid).reshape(-1)], minlength=num_experts)


def max_over_mean_load(load: np.ndarray) -> float:
  return float(load.max() / max(load.mean(), 1e-12))


def device_rows(
  expert_index, valid, num_experts: int, expert_shards: int, token_groups: int = 1
) -> np.ndarray:
  """[token_groups, expert_shards] routed rows each device processes: tokens (the
  first axis of expert_index, in order) in contiguous groups, experts in
  contiguous blocks (the latency model of the module doc)."""
  index, valid = np.asarray(expert_index), np.asarray(valid)
  if index.shape[0] % token_groups or num_experts % expert_shards:
    raise ValueError(
      f"{index.shape[0]} tokens / {token_groups} groups or {num_experts} "
      f"experts / {expert_shards} shards do not divide"
    )
  per_block = num_experts // expert_shards
  rows = np.zeros((token_groups, expert_shards), np.int64)
  for g, (gi, gv) in enumerate(zip(np.split(index, token_groups), np.split(valid, token_groups))):
    rows[g] = np.bincount(gi[gv] // per_block, minlength=expert_shards)
  return rows


def busiest_device(rows: np.ndarray) -> float:
  """The busiest device's rows over the balanced count (the latency model's slowdown)."""
  return float(rows.max() / max(rows.sum() / rows.size, 1e-12))


def capped_load(load: np.ndarray, capacity: int) -> np.ndarray:
  """Rows each expert processes when capacity dispatch keeps at most `capacity`."""
  return np.minimum(load, capacity)


def drop_rate(load: np.ndarray, capacity: int) -> float:
  """Fraction of routed slots capacity dispatch drops: sum_e max(load_e - C, 0) / sum load."""
  load = np.asarray(load)
  return float(np.maximum(load - capacity, 0).sum() / max(load.sum(), 1))


def simulated_ttft(routing, num_experts: int, expert_shards: int = 8) -> dict:
  """The module doc's TTFT model over every MoE layer of `routing` ((expert_index,
  valid) pairs): {"rows": sum_l max_d rows_{l,d}, "over_balanced": that over
  sum_l rows_l / expert_shards}."""
  busiest = balanced = 0.0
  for index, valid in routing:
    rows = device_rows(
      np.asarray(index).reshape(-1, np.shape(index)[-1]),
      np.asarray(valid).reshape(-1, np.shape(index)[-1]),
      num_experts,
      expert_shards,
    )
    busiest, balanced = busiest + rows.max(), balanced + rows.sum() / expert_shards
  return {"rows": float(busiest), "over_balanced": float(busiest / max(balanced, 1e-12))}


def prefill_seconds(graphdef, params, rest, tokens, repeats: int = 5) -> float:
  """Measured prefill: the median wall time of one compiled forward on tokens [B, L]
  (compiled and run once before timing)."""
  from moejax.profiling.timing import blocked_times

  tokens = jax.numpy.asarray(tokens, jax.numpy.int32)

  def forward():
    return routing_of(graphdef, params, rest, tokens)

  blocked_times(forward, 1)
  return float(np.median(blocked_times(forward, repeats)))


def layer_report(
  expert_index_TxK,
  valid_TxK,
  batch: int,
  num_experts: int,
  expert_shards: int,
  token_groups: int = 1,
  span: slice = slice(None),
) -> dict:
  """The module doc's figures for one MoE layer's routing of `batch` equal rows
  (same_set_fraction over the positions in `span`; the loads over every position)."""
  index, valid = np.asarray(expert_index_TxK), np.asarray(valid_TxK)
  load = expert_load(index, valid, num_experts)
  return {
    "same_set_fraction": same_set_fraction(index.reshape(batch, -1, index.shape[-1]), span),
    "max_over_mean_load": max_over_mean_load(load),
    "busiest_device": busiest_device(
      device_rows(index, valid, num_experts, expert_shards, token_groups)
    ),
    "load": load.tolist(),
  }


def kind_report(
  routing,
  batch: int,
  num_experts: int,
  expert_shards: int,
  capacity: int,
  span: slice = slice(None),
) -> list[dict]:
  """Per MoE layer of `routing` ((expert_index, valid) pairs): layer_report over
  `expert_shards` devices, the busiest device over the balanced count once each
  expert keeps at most `capacity` rows (busiest_device_capped) and the fraction of
  slots that cap drops (drop_rate)."""
  layers = []
  for index, valid in routing:
    index, valid = np.asarray(index), np.asarray(valid)
    report = layer_report(index, valid, batch, num_experts, expert_shards, span=span)
    capped = capped_load(np.asarray(report["load"]), capacity)
    blocks = capped.reshape(expert_shards, -1).sum(1)
    report["busiest_device_capped"] = float(blocks.max() / max(valid.sum() / blocks.size, 1e-12))
    report["drop_rate"] = drop_rate(report["load"], capacity)
    layers.append(report)
  return layers
