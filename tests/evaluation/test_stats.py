"""moejax/evaluation/stats.py against scipy, closed forms, hand-computed cases and
exhaustive enumeration."""

import itertools
import math

import numpy as np
import scipy.stats
import pytest

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.evaluation.stats import paired_bootstrap, resampled_differences

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


# ---- t, Wilson, bootstrap of a mean, slope, Holm, verdicts, tables ----------------------------


@pytest.mark.parametrize("seed, n", [(0, 2), (1, 3), (2, 7), (3, 40)])
def test_t_interval_equals_scipys(seed, n):
  values = np.random.default_rng(seed).normal(0.3, 2.0, n)
  found = stats.t_interval(values, null=0.1)
  test = scipy.stats.ttest_1samp(values, 0.1)
  lo, hi = scipy.stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
  assert (found.lo, found.hi) == pytest.approx((lo, hi), rel=1e-12, abs=1e-14)
  assert found.p == pytest.approx(test.pvalue, rel=1e-10)
  assert found.std == pytest.approx(values.std(ddof=1), rel=1e-14)


def test_t_quantiles_match_printed_tables():
  # Student's t tables, 97.5% quantile: half-width / (s / sqrt(n)) for n = df + 1
  for df, quantile in [(1, 12.706204736174698), (4, 2.7764451051977934), (30, 2.0422724563012373)]:
    values = np.array([0.0, 2.0] + [1.0] * (df - 1))  # mean 1, std s known
    found = stats.t_interval(values)
    s = values.std(ddof=1)
    assert (found.hi - found.mean) / (s / math.sqrt(df + 1)) == pytest.approx(quantile, rel=1e-12)


def test_paired_difference_pairs_by_position_and_refuses_ragged_input():
  diff = stats.paired_difference([3.0, 5.0, 7.0], [2.0, 3.0, 4.0])  # d = 1, 2, 3
  assert (diff.n, diff.mean, diff.std) == (3, 2.0, 1.0)
  half = 4.302652729749464 / math.sqrt(3)
  assert (diff.lo, diff.hi) == pytest.approx((2 - half, 2 + half), rel=1e-13)
  one = stats.paired_difference([3.0], [2.5])
  assert (one.n, one.mean, one.lo, one.hi, one.p) == (1, 0.5, None, None, None)
  with pytest.raises(ValueError, match="one value per draw"):
    stats.paired_difference([1.0, 2.0], [1.0])


def test_wilson_by_hand_and_binomial_p():
  # 8 of 10, z = 1.959963984540054: centre (0.8 + z^2/20) / (1 + z^2/10)
  z = 1.959963984540054
  centre = (0.8 + z * z / 20) / (1 + z * z / 10)
  half = z * math.sqrt(0.8 * 0.2 / 10 + z * z / 400) / (1 + z * z / 10)
  found = stats.wilson(8, 10, null=0.5)
  assert (found.lo, found.hi) == pytest.approx((centre - half, centre + half), rel=1e-12)
  assert found.p == pytest.approx(112 / 1024, rel=1e-12)  # P(X >= 8) + P(X <= 2), X ~ B(10, .5)
  assert stats.wilson(0, 5).lo == 0.0 and stats.wilson(5, 5).hi == 1.0
  with pytest.raises(ValueError, match="successes"):
    stats.wilson(6, 5)


def test_bootstrap_mean_of_two_values_by_enumeration():
  # resampled means of [0, 1] with replacement: 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4
  found = stats.bootstrap_mean([0.0, 1.0], resamples=40000, seed=0)
  assert found.mean == 0.5 and found.std == pytest.approx(math.sqrt(0.5))
  assert (found.lo, found.hi) == (0.0, 1.0)
  assert found.p == pytest.approx(0.5, abs=0.02)  # 2 * P(mean <= 0) = 2 * 1/4


def test_slope_equals_linregress_and_exact_lines():
  x = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
  y = 0.5 * np.log(x) + np.array([0.01, -0.02, 0.0, 0.03, -0.01])
  found = stats.slope(np.log(x), y, null=0.75)
  fit = scipy.stats.linregress(np.log(x), y)
  half = scipy.stats.t.ppf(0.975, 3) * fit.stderr
  assert (found.mean, found.lo, found.hi) == pytest.approx(
    (fit.slope, fit.slope - half, fit.slope + half), rel=1e-12
  )
  assert stats.verdict(found, "lower", null=0.75) == "reproduces"
  exact = stats.slope([0, 1, 2], [1.0, 3.0, 5.0])
  assert (exact.mean, exact.lo, exact.hi) == pytest.approx((2.0, 2.0, 2.0), abs=1e-12)
  flat = stats.slope([120, 360, 1200], [0.25, 0.25, 0.25])  # linregress: stderr nan
  assert (flat.mean, flat.std, flat.lo, flat.hi, flat.p) == (0.0, 0.0, 0.0, 0.0, 1.0)


def test_holm_by_hand():
  # p sorted: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06), 0.5 (x1 = 0.5)
  assert stats.holm([0.03, 0.5, 0.01, None, 0.02]) == pytest.approx([0.06, 0.5, 0.04, None, 0.06])
  assert stats.holm([0.2, 0.6]) == [0.4, 0.6]  # monotone: max(0.4, 0.6)
  assert stats.holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1


def test_verdict_words():
  lower = stats.paired_difference([1.0, 1.1, 0.9], [2.0, 2.0, 2.0])
  assert stats.verdict(lower, "lower") == "reproduces"
  assert stats.verdict(lower, "higher") == "opposite direction"
  assert stats.verdict(lower, None) == "differs (lower)"
  mixed = stats.paired_difference([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
  assert stats.verdict(mixed, "higher") == "no detectable difference (|delta| < 4.48)"
  assert stats.verdict(mixed, "higher", null=2.0) == "no detectable difference (|delta| < 2.48)"
  assert stats.verdict(stats.paired_difference([1.0], [0.0]), "lower") == "interval undefined (n=1)"
  assert (
    stats.verdict(stats.paired_difference([2.5, 2.7], [2.5, 2.7]), "lower")
    == "identical on all 2 draws"
  )
  with pytest.raises(ConfigError, match="expect='down'"):
    stats.verdict(lower, "down")


def test_format_interval_and_markdown_table():
  diff = stats.paired_difference([3.0, 5.0, 7.0], [2.0, 3.0, 4.0])
  assert stats.format_interval(diff) == "+2.0000 ± 1.0000 [-0.4841, +4.4841]"
  assert stats.format_interval(stats.paired_difference([1.0], [0.5])) == "+0.5000"
  assert stats.markdown_table(["a", "b"], [[1, "x|y"], [2.5, None]]) == (
    "| a | b |\n|" + "---|" * 2 + "\n| 1 | x\\|y |\n| 2.5 | None |"
  )
  with pytest.raises(ValueError, match="1 cells for 2 columns"):
    stats.markdown_table(["a", "b"], [[1]])
