"""Partition agreement (moejax/evaluation/partitions.py): NMI and ARI by hand, by
pair counting, under renaming, and refusals."""

import itertools
import math

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.evaluation.partitions import adjusted_rand_index, nmi


def test_nmi_by_hand():
  # joint (0,0)=1/2, (1,0)=1/4, (1,1)=1/4; marginals (1/2, 1/2) and (3/4, 1/4)
  mutual = 0.5 * math.log(4 / 3) + 0.25 * math.log(2 / 3) + 0.25 * math.log(2)
  h_b = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
  assert nmi([0, 0, 1, 1], [0, 0, 0, 1]) == pytest.approx(
    2 * mutual / (math.log(2) + h_b), abs=1e-12
  )
  assert nmi([0, 0, 0, 1], [0, 0, 1, 1]) == pytest.approx(nmi([0, 0, 1, 1], [0, 0, 0, 1]))
  assert nmi([0, 0, 1, 1, 2, 2], [5, 5, 3, 3, 9, 9]) == pytest.approx(1.0, abs=1e-12)
  assert nmi([0, 1, 0, 1], [0, 0, 1, 1]) == 0.0  # independent
  assert nmi([3, 3, 3], [1, 1, 1]) == 1.0  # both constant: the same partition
  rng = np.random.default_rng(0)
  assert nmi(rng.integers(0, 4, 100_000), rng.integers(0, 8, 100_000)) < 1e-3


def test_ari_by_hand_and_by_pair_counting():
  assert adjusted_rand_index([0, 1, 2], [0, 1, 2]) == 1.0
  assert adjusted_rand_index([0, 0, 1, 1], [5, 5, 2, 2]) == 1.0  # a relabelling
  assert adjusted_rand_index([0, 0, 1, 1], [0, 0, 1, 2]) == pytest.approx(4 / 7)
  assert adjusted_rand_index([0, 1, 0, 1], [0, 0, 1, 1]) == pytest.approx(-0.5)
  rng = np.random.default_rng(0)
  for _ in range(5):
    a, b = rng.integers(0, 3, 30), rng.integers(0, 4, 30)
    same = [(a[i] == a[j], b[i] == b[j]) for i, j in itertools.combinations(range(30), 2)]
    n11 = sum(x and y for x, y in same)
    n10, n01 = sum(x and not y for x, y in same), sum(y and not x for x, y in same)
    n00 = len(same) - n11 - n10 - n01  # Steinley (2004) eq. 5, pair-counting form
    ari = 2 * (n00 * n11 - n01 * n10) / ((n00 + n01) * (n01 + n11) + (n00 + n10) * (n10 + n11))
    assert adjusted_rand_index(a, b) == pytest.approx(ari)


@pytest.mark.parametrize("metric", [nmi, adjusted_rand_index])
def test_labelings_of_different_lengths_are_refused(metric):
  with pytest.raises(ConfigError, match=r"\(2,\), \(3,\)"):
    metric([0, 1], [0, 1, 1])
  with pytest.raises(ConfigError, match="non-empty"):
    metric([], [])
