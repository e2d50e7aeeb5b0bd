"""GEMQ's bit allocation (ICML 2026, arXiv 2605.23078, code jndeng/GEMQ): one
bit-width per expert, chosen for all experts of all layers together.

Given c[i, j], the cost of quantizing expert i at bits[j] (GEMQ: the
Fisher-weighted block-output error, sum_t (dL/dh)^2 (h - h^{i@b})^2, with only
expert i quantized), and the expert's parameter count n_i, solve the
multiple-choice knapsack

    min sum_i c[i, x_i]   s.t.   sum_i n_i bits[x_i] <= budget * sum_i n_i,

i.e. an average of at most `budget` bits per parameter. GEMQ states it as an
ILP; it is a multiple-choice knapsack, solved here exactly by dynamic
programming over the bits spent, in units of the greatest common divisor of
the item sizes (experts of one model have one or a few sizes, so the table
is small: zoo-s, 96 equal experts at 2.5 bits, is 96 x 240 cells).

`per_layer` is the baseline the paper compares with: every layer gets the
same average budget and is solved on its own.
"""

from __future__ import annotations

import math

import numpy as np

from moejax.errors import ConfigError


def _checked(costs, bits, sizes, budget: float):
  costs = np.asarray(costs, np.float64)
  bits = np.asarray(bits, np.int64)
  if costs.ndim != 2 or costs.shape[1] != bits.size:
    raise ConfigError(
      f"costs have shape {costs.shape}; expected [experts, {bits.size}] for bits {bits.tolist()}"
    )
  sizes = np.ones(costs.shape[0], np.int64) if sizes is None else np.asarray(sizes, np.int64)
  if sizes.shape != (costs.shape[0],) or np.any(sizes <= 0):
    raise ConfigError(f"sizes must be {costs.shape[0]} positive parameter counts")
  if budget < bits.min():
    raise ConfigError(
      f"budget={budget} bits is below the minimum achievable, {bits.min()} bits for every expert"
    )
  return costs, bits, sizes


def allocate(costs, bits, budget: float, sizes=None) -> np.ndarray:
  """The index into `bits` for every expert that minimises the total cost with
  at most `budget` average bits per parameter (module doc). Exact (DP)."""
  costs, bits, sizes = _checked(costs, bits, sizes, budget)
  unit = math.gcd(*sizes.tolist())
  units = sizes // unit
  capacity = int(math.floor(budget * sizes.sum() / unit + 1e-9))  # in bits x unit
  floor = int((bits.min() * units).sum())  # every expert at the fewest bits
  spare = capacity - floor  # bits x units above the floor
  extra = [(bits - bits.min()) * u for u in units]  # per expert, per choice
  # best[s]: least cost of the experts so far spending exactly s spare units
  best = np.full(spare + 1, np.inf)
  best[0] = 0.0
  choice = np.zeros((len(costs), spare + 1), np.int64)
  for i in range(len(costs)):
    new = np.full(spare + 1, np.inf)
    for j in np.argsort(extra[i], kind="stable"):
      step = int(extra[i][j])
      if step > spare:
        continue
      candidate = np.full(spare + 1, np.inf)
      candidate[step:] = best[: spare + 1 - step] + costs[i, j]
      better = candidate < new
      new[better] = candidate[better]
      choice[i, better] = j
    best = new
  spent = int(np.argmin(best))
  picked = np.zeros(len(costs), np.int64)
  for i in range(len(costs) - 1, -1, -1):
    picked[i] = choice[i, spent]
    spent -= int(extra[i][picked[i]])
  return picked


def per_layer(costs, bits, budget: float, layer_of, sizes=None) -> np.ndarray:
  """The baseline: each layer's experts solved alone at the same average budget."""
  costs, bits, sizes = _checked(costs, bits, sizes, budget)
  layer_of = np.asarray(layer_of)
  picked = np.zeros(len(costs), np.int64)
  for layer in np.unique(layer_of):
    members = np.flatnonzero(layer_of == layer)
    picked[members] = allocate(costs[members], bits, budget, sizes[members])
  return picked


def total_cost(costs, picked) -> float:
  picked = np.asarray(picked, np.int64)
  return float(np.asarray(costs, np.float64)[np.arange(len(picked)), picked].sum())


def average_bits(bits, picked, sizes=None) -> float:
  picked = np.asarray(picked, np.int64)
  sizes = np.ones(len(picked)) if sizes is None else np.asarray(sizes, np.float64)
  return float((np.asarray(bits)[picked] * sizes).sum() / sizes.sum())
