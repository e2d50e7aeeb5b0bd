"""The paired bootstrap on cases computed by hand and by exhaustive enumeration."""
import itertools
import math

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.evaluation.bootstrap import paired_bootstrap, resampled_differences

LN2 = math.log(2)


def every_resample(n):
  """All n**n draws of n documents with replacement: the exact bootstrap distribution."""
  return np.array(list(itertools.product(range(n), repeat=n)))


def test_constant_per_byte_difference_gives_a_zero_width_interval():
  rng = np.random.default_rng(0)
  num_bytes = rng.integers(1, 500, 40)
  nats_b = rng.uniform(0.5, 3.0, 40) * num_bytes  # documents differ a lot ...
  nats_a = nats_b + 0.25 * LN2 * num_bytes  # ... but model a is worse by 0.25 bpb on each
  out = paired_bootstrap(nats_a, nats_b, num_bytes, num_resamples=500, seed=3)
  for value in (out.difference, out.mean, out.low, out.high):
    assert value == pytest.approx(0.25, abs=1e-12)
  assert out.std < 1e-12 and out.num_resamples == 500 and out.num_documents == 40


def test_two_documents_by_hand():
  # bits differences 2 and 3 over 1 and 3 bytes; the 4 resamples give
  # (0,0): 4/2 = 2, (0,1) and (1,0): 5/4, (1,1): 6/6 = 1
  nats_a, nats_b, num_bytes = np.array([2.0, 3.0]) * LN2, np.zeros(2), np.array([1, 3])
  out = paired_bootstrap(nats_a, nats_b, num_bytes, indices=every_resample(2))
  assert out.difference == pytest.approx(5 / 4, abs=1e-15)
  assert out.mean == pytest.approx((2 + 5 / 4 + 5 / 4 + 1) / 4, abs=1e-15)
  assert out.std == pytest.approx(math.sqrt((0.375**2 + 2 * 0.125**2 + 0.625**2) / 4), abs=1e-15)
  # linear percentiles of the sorted [1, 5/4, 5/4, 2]: positions 0.075 and 2.925
  assert out.low == pytest.approx(1 + 0.075 * 0.25, abs=1e-15)
  assert out.high == pytest.approx(1.25 + 0.925 * 0.75, abs=1e-15)


def test_random_resamples_match_the_exact_distribution():
  nats_a, nats_b, num_bytes = np.array([5.0, 1.0, 9.0]), np.array([4.0, 2.0, 3.0]), [4, 2, 6]
  exact = paired_bootstrap(nats_a, nats_b, num_bytes, indices=every_resample(3))
  drawn = paired_bootstrap(nats_a, nats_b, num_bytes, num_resamples=20000, seed=1)
  assert drawn.difference == exact.difference
  assert abs(drawn.mean - exact.mean) < 4 * exact.std / math.sqrt(20000)
  assert drawn.std == pytest.approx(exact.std, rel=0.03)
  # each of the 27 resamples has probability 1/27 > 2.5%, so the 2.5% and 97.5%
  # quantiles of the exact distribution are its smallest and largest values
  values = resampled_differences(nats_a, nats_b, num_bytes, every_resample(3))
  assert (drawn.low, drawn.high) == (values.min(), values.max())


def test_seeded_and_paired():
  rng = np.random.default_rng(5)
  nats_a, nats_b, num_bytes = rng.uniform(1, 9, 30), rng.uniform(1, 9, 30), rng.integers(1, 9, 30)
  one = paired_bootstrap(nats_a, nats_b, num_bytes, seed=7)
  assert one == paired_bootstrap(nats_a, nats_b, num_bytes, seed=7)
  assert one != paired_bootstrap(nats_a, nats_b, num_bytes, seed=8)
  swapped = paired_bootstrap(nats_b, nats_a, num_bytes, seed=7)  # same resamples: negated
  assert (swapped.low, swapped.high) == pytest.approx((-one.high, -one.low), abs=1e-12)


def test_bad_input():
  with pytest.raises(ConfigError, match="same documents"):
    paired_bootstrap([1.0, 2.0], [1.0], [1, 1])
  with pytest.raises(ConfigError, match="confidence"):
    paired_bootstrap([1.0], [1.0], [1], confidence=1.0)
