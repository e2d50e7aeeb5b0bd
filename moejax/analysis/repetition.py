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
most C x (experts per device) rows whatever the prompt (`capped_load`).
Guesses: the latency model counts rows only (no all-to-all or attention time).
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from moejax.analysis.router_inference import captured_forward


@functools.partial(jax.jit, static_argnums=0)
def routing_of(graphdef, params, rest, tokens):
  """Per MoE layer, (expert_index [B*L, K], valid [B*L, K]) of the model on tokens [B, L]."""
  model = nnx.merge(graphdef, params, rest)
  _, aux, _ = captured_forward(model, tokens)
  return [(layer["expert_index"], layer["valid"]) for layer in aux["moe"]]


def same_set_fraction(expert_index_BxLxK: np.ndarray) -> float:
  """Mean over rows of the fraction of positions whose top-k set (order ignored)
  is the row's most common one."""
  fractions = []
  for row in np.asarray(expert_index_BxLxK):
    sets = [tuple(sorted(s)) for s in row.tolist()]
    fractions.append(max(sets.count(s) for s in set(sets)) / len(sets))
  return float(np.mean(fractions))


def expert_load(expert_index, valid, num_experts: int) -> np.ndarray:
  """Routed (valid) slots per expert."""
  index = np.asarray(expert_index).reshape(-1)
  return np.bincount(index[np.asarray(valid).reshape(-1)], minlength=num_experts)


def max_over_mean_load(load: np.ndarray) -> float:
  return float(load.max() / max(load.mean(), 1e-12))


def device_rows(expert_index, valid, num_experts: int, expert_shards: int,
                token_groups: int = 1) -> np.ndarray:
  """[token_groups, expert_shards] routed rows each device processes: tokens (the
  first axis of expert_index, in order) in contiguous groups, experts in
  contiguous blocks (the latency model of the module doc)."""
  index, valid = np.asarray(expert_index), np.asarray(valid)
  if index.shape[0] % token_groups or num_experts % expert_shards:
    raise ValueError(f"{index.shape[0]} tokens / {token_groups} groups or {num_experts} "
                     f"experts / {expert_shards} shards do not divide")
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


def layer_report(expert_index_TxK, valid_TxK, batch: int, num_experts: int,
                 expert_shards: int, token_groups: int = 1) -> dict:
  """The module doc's figures for one MoE layer's routing of `batch` equal rows."""
  index, valid = np.asarray(expert_index_TxK), np.asarray(valid_TxK)
  load = expert_load(index, valid, num_experts)
  return {"same_set_fraction": same_set_fraction(index.reshape(batch, -1, index.shape[-1])),
          "max_over_mean_load": max_over_mean_load(load),
          "busiest_device": busiest_device(device_rows(index, valid, num_experts,
                                                       expert_shards, token_groups)),
          "load": load.tolist()}


def kind_report(routing, batch: int, num_experts: int, expert_shards: int, capacity: int
                ) -> list[dict]:
  """Per MoE layer of `routing` ((expert_index, valid) pairs): layer_report over
  `expert_shards` devices, and the busiest device over the balanced count once each
  expert keeps at most `capacity` rows (busiest_device_capped)."""
  layers = []
  for index, valid in routing:
    index, valid = np.asarray(index), np.asarray(valid)
    report = layer_report(index, valid, batch, num_experts, expert_shards)
    capped = capped_load(np.asarray(report["load"]), capacity)
    blocks = capped.reshape(expert_shards, -1).sum(1)
    report["busiest_device_capped"] = float(blocks.max() / max(valid.sum() / blocks.size, 1e-12))
    layers.append(report)
  return layers
