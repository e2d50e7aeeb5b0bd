"""GEMQ's global bit allocation (moejax/posttrain/bit_allocation.py): the DP
against brute force over every assignment, global <= per-layer, refusals."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moejax.errors import ConfigError
from moejax.posttrain import bit_allocation as ba

BITS = (2, 3, 4, 8)


def brute_force(costs, bits, budget, sizes):
  best = np.inf
  for picked in itertools.product(range(len(bits)), repeat=len(costs)):
    if ba.average_bits(bits, picked, sizes) <= budget + 1e-12:
      best = min(best, ba.total_cost(costs, picked))
  return best


@settings(max_examples=60, deadline=None)
@given(
  seed=st.integers(0, 2**31 - 1),
  experts=st.integers(1, 6),
  budget=st.sampled_from([2.0, 2.5, 3.0, 3.3, 4.0, 5.5, 8.0]),
  unequal=st.booleans(),
)
def test_dp_equals_brute_force(seed, experts, budget, unequal):
  rng = np.random.default_rng(seed)
  # costs fall with bits (as quantization error does), with random slopes
  costs = np.sort(rng.exponential(1.0, (experts, len(BITS))), axis=1)[:, ::-1]
  sizes = rng.integers(1, 4, experts) * 6 if unequal else None
  picked = ba.allocate(costs, BITS, budget, sizes)
  assert ba.average_bits(BITS, picked, sizes) <= budget + 1e-12
  assert ba.total_cost(costs, picked) == pytest.approx(
    brute_force(costs, BITS, budget, sizes), rel=1e-12, abs=1e-12
  )


def test_dp_equals_brute_force_on_costs_that_do_not_fall_with_bits():
  rng = np.random.default_rng(0)
  for _ in range(20):
    costs = rng.random((5, len(BITS)))
    picked = ba.allocate(costs, BITS, 3.0)
    assert ba.total_cost(costs, picked) == pytest.approx(brute_force(costs, BITS, 3.0, None))


def test_global_allocation_costs_no_more_than_per_layer_and_less_when_layers_differ():
  rng = np.random.default_rng(1)
  layer_of = np.repeat(np.arange(3), 8)
  # layer 0 is 10x as sensitive as the others: the global solution moves bits there
  scale = np.where(layer_of == 0, 10.0, 1.0)[:, None]
  costs = scale * np.sort(rng.exponential(1.0, (24, len(BITS))), axis=1)[:, ::-1]
  for budget in (2.5, 3.0, 4.0):
    glob = ba.allocate(costs, BITS, budget)
    local = ba.per_layer(costs, BITS, budget, layer_of)
    assert ba.average_bits(BITS, local) <= budget and ba.average_bits(BITS, glob) <= budget
    assert ba.total_cost(costs, glob) < ba.total_cost(costs, local)
    assert ba.average_bits(BITS, glob[layer_of == 0]) > ba.average_bits(BITS, glob[layer_of != 0])


def test_bad_requests_are_refused():
  costs = np.ones((3, len(BITS)))
  with pytest.raises(ConfigError, match="budget=1.5 bits is below the minimum"):
    ba.allocate(costs, BITS, 1.5)
  with pytest.raises(ConfigError, match=r"shape \(3, 3\)"):
    ba.allocate(np.ones((3, 3)), BITS, 3.0)
  with pytest.raises(ConfigError, match="positive parameter counts"):
    ba.allocate(costs, BITS, 3.0, sizes=[1, 0, 2])
