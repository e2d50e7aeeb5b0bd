"""The overtrained-experts analysis (moejax/merging/overtraining.py) on hand-made
curves: the early stop against the rule worked out by hand and a brute-force
reading of it, late-learned examples by their gain split, retention as a ratio
of summed gains."""

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.merging import overtraining


@pytest.mark.parametrize(
  "curve, tolerance, want",
  [
    # gains 1.0, 0.5, 0.05 (< 0.1 * 1.55): stop at 3, the best of 1..3 is 3
    ([3.0, 2.0, 1.5, 1.45, 1.0], 0.1, 3),
    # the same curve, tolerance 0: never below a zero bar until the end
    ([3.0, 2.0, 1.5, 1.45, 1.0], 0.0, 4),
    # a rise at 2 (gain -0.2 < 0): stop at 2, keep the better checkpoint 1
    ([3.0, 2.0, 2.2, 1.0], 0.0, 1),
    # aggressive: 0.6 is below 0.5 * 1.6, stop at 2
    ([3.0, 2.0, 1.4, 1.3], 0.5, 2),
    ([3.0, 2.0], 0.1, 1),
  ],
)
def test_early_stop_by_hand(curve, tolerance, want):
  assert overtraining.early_stop(curve, tolerance) == want


def test_early_stop_agrees_with_a_brute_force_reading_of_the_rule():
  rng = np.random.default_rng(0)
  for _ in range(200):
    curve = np.concatenate([[5.0], 5.0 - np.cumsum(rng.normal(0.3, 0.3, size=8))])
    tolerance = float(rng.uniform(0, 0.5))
    fired = [c for c in range(1, 9) if curve[c - 1] - curve[c] < tolerance * (curve[0] - curve[c])]
    stop = fired[0] if fired else 8
    best = min(range(1, stop + 1), key=lambda c: (curve[c], c))
    assert overtraining.early_stop(curve, tolerance) == best


def test_early_stop_refuses_bad_input():
  with pytest.raises(ConfigError, match="base and >= 1 checkpoint"):
    overtraining.early_stop([1.0], 0.1)
  with pytest.raises(ConfigError, match="tolerance=-0.1"):
    overtraining.early_stop([2.0, 1.0], -0.1)
  with pytest.raises(ConfigError, match="finite"):
    overtraining.early_stop([2.0, np.nan], 0.1)


def test_late_learned_splits_the_gain_at_the_middle_checkpoint():
  base = np.array([4.0, 4.0, 4.0, 4.0, 4.0])
  middle = np.array([3.9, 2.0, 3.0, 4.5, 4.0])
  final = np.array([2.0, 1.9, 3.0, 3.0, 4.2])
  # gains 2, 2.1, 1, 1, -0.2; after the middle 1.9, 0.1, 0, 1.5, -0.2
  late, early = overtraining.late_learned(base, middle, final, share=0.5)
  assert late.tolist() == [True, False, False, True, False]
  assert early.tolist() == [False, True, True, False, False]  # the last gained nothing


def test_retention_is_the_share_of_summed_gain_kept():
  base = np.array([4.0, 4.0, 4.0])
  expert = np.array([2.0, 3.0, 4.0])
  merged = np.array([3.0, 3.5, 4.5])
  assert overtraining.retention(base, expert, merged) == pytest.approx((1 + 0.5 - 0.5) / 3)
  assert overtraining.retention(base, expert, merged, [True, False, False]) == 0.5
  assert np.isnan(overtraining.retention(base, expert, merged, [False, False, True]))
  with pytest.raises(ConfigError, match="different shapes"):
    overtraining.late_learned(base, base[:2], base)
