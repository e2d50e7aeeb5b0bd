"""Every interval, test, verdict and table of moejax's studies, in one place.

Intervals (each at `confidence`, 95% by default):
  t_interval / paired_difference  mean of (paired) differences ± t_{1-a/2, n-1} s / sqrt(n)
                                  (scipy.stats.t), with its two-sided p-value against `null`
  wilson                          Wilson score interval of a binomial fraction
  bootstrap_mean                  percentile bootstrap of a mean (numpy default_rng(seed))
  paired_bootstrap                per-document paired bootstrap of a bpb difference
  slope                           least-squares slope with its t-interval (n - 2 df)
  holm                            Holm's step-down adjustment of a family of p-values

`verdict(interval, expect, null)` turns an interval into the words every table uses:
  reproduces                                the interval excludes `null` on the expected side
  opposite direction                        it excludes `null` on the other side
  no detectable difference (|delta| < X)    it holds `null`; X = the largest distance from
                                            `null` the interval allows
  identical on all N draws                  every paired difference is exactly 0
  interval undefined (n=1)                  one value: no spread to estimate
  differs (lower|higher)                    no expected direction, and the interval excludes `null`
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.stats

from moejax.errors import ConfigError

DIRECTIONS = ("lower", "higher", None)


@dataclasses.dataclass(frozen=True)
class Interval:
  """A point estimate with its interval; lo/hi (and std, p) None where undefined (n = 1).

  `exact_zero`: every paired difference was exactly 0 (verdict: identical)."""

  n: int
  mean: float
  std: float | None
  lo: float | None
  hi: float | None
  p: float | None = None  # two-sided, against the null the interval was built for
  exact_zero: bool = False

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


# Older name: a paired difference is an Interval of the differences' mean.
PairedDifference = Interval


def _check_confidence(confidence: float) -> None:
  if not 0 < confidence < 1:
    raise ConfigError(f"confidence={confidence} must be in (0, 1)")


def t_interval(values, *, confidence: float = 0.95, null: float = 0.0) -> Interval:
  """Student-t interval of the mean of `values` (float64, ddof 1) and its p-value."""
  _check_confidence(confidence)
  d = np.asarray(values, np.float64)
  if d.ndim != 1 or d.size == 0:
    raise ValueError(f"need a non-empty 1-d array of values, got shape {d.shape}")
  mean = float(d.mean())
  if d.size == 1:
    return Interval(1, mean, None, None, None)
  std = float(d.std(ddof=1))
  df = d.size - 1
  half = float(scipy.stats.t.ppf(0.5 + confidence / 2, df)) * std / math.sqrt(d.size)
  if std == 0:
    p = 1.0 if mean == null else 0.0
  else:
    p = float(2 * scipy.stats.t.sf(abs(mean - null) / (std / math.sqrt(d.size)), df))
  return Interval(
    int(d.size), mean, std, mean - half, mean + half, p, exact_zero=bool(np.all(d == 0))
  )


def paired_difference(arm, reference, *, confidence: float = 0.95) -> Interval:
  """t_interval of arm[i] - reference[i] (the same draws, in the same order)."""
  arm, reference = np.asarray(arm, np.float64), np.asarray(reference, np.float64)
  if arm.shape != reference.shape or arm.ndim != 1:
    raise ValueError(
      f"need one value per draw in each arm, got shapes {arm.shape} and {reference.shape}"
    )
  return t_interval(arm - reference, confidence=confidence)


def wilson(
  successes: int, total: int, *, confidence: float = 0.95, null: float | None = None
) -> Interval:
  """Wilson score interval of successes / total; p: exact two-sided binomial test
  against `null` (None when no null is given)."""
  _check_confidence(confidence)
  if total < 1 or not 0 <= successes <= total:
    raise ValueError(f"wilson needs 0 <= successes <= total, total >= 1; got {successes}, {total}")
  z = float(scipy.stats.norm.ppf(0.5 + confidence / 2))
  p_hat = successes / total
  denominator = 1 + z * z / total
  centre = (p_hat + z * z / (2 * total)) / denominator
  half = z * math.sqrt(p_hat * (1 - p_hat) / total + z * z / (4 * total * total)) / denominator
  p = None if null is None else float(scipy.stats.binomtest(successes, total, null).pvalue)
  std = math.sqrt(p_hat * (1 - p_hat))
  return Interval(total, p_hat, std, max(centre - half, 0.0), min(centre + half, 1.0), p)


def bootstrap_mean(
  values, *, resamples: int = 2000, seed: int = 0, confidence: float = 0.95, null: float = 0.0
) -> Interval:
  """Percentile bootstrap interval of the mean; std of the values (ddof 1); p: twice
  the smaller fraction of resampled means on either side of `null`."""
  _check_confidence(confidence)
  values = np.asarray(values, np.float64)
  if values.ndim != 1 or values.size == 0:
    raise ValueError(f"need a non-empty 1-d array of values, got shape {values.shape}")
  if resamples < 1:
    raise ConfigError(f"resamples={resamples} must be >= 1")
  picks = np.random.default_rng(seed).integers(0, values.size, (resamples, values.size))
  means = values[picks].mean(1)
  tail = 100 * (1 - confidence) / 2
  low, high = np.percentile(means, [tail, 100 - tail])
  std = float(values.std(ddof=1)) if values.size > 1 else 0.0
  p = float(min(1.0, 2 * min((means <= null).mean(), (means >= null).mean())))
  return Interval(int(values.size), float(values.mean()), std, float(low), float(high), p)


@dataclasses.dataclass(frozen=True)
class BootstrapDifference:
  """Paired per-document bootstrap of bpb_a - bpb_b (`paired_bootstrap`)."""

  difference: float  # on all documents: bpb_a - bpb_b
  mean: float  # of the resampled differences
  std: float  # of the resampled differences (ddof 0)
  low: float
  high: float
  confidence: float
  num_resamples: int
  num_documents: int

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def resample_indices(num_documents: int, num_resamples: int, seed: int) -> np.ndarray:
  """int64 [num_resamples, num_documents]: documents drawn with replacement."""
  return np.random.default_rng(seed).integers(0, num_documents, (num_resamples, num_documents))


def resampled_differences(nats_a, nats_b, num_bytes, indices: np.ndarray) -> np.ndarray:
  """float64 [R]: bpb_a - bpb_b on each resample (rows of `indices`)."""
  diff = (np.asarray(nats_a, np.float64) - np.asarray(nats_b, np.float64)) / math.log(2)
  return diff[indices].sum(1) / np.asarray(num_bytes, np.float64)[indices].sum(1)


def paired_bootstrap(
  nats_a,
  nats_b,
  num_bytes,
  *,
  num_resamples: int = 1000,
  seed: int = 0,
  confidence: float = 0.95,
  indices: np.ndarray | None = None,
) -> BootstrapDifference:
  """The paired bootstrap of bpb_a - bpb_b = sum(bits_a - bits_b) / sum(bytes) over documents.

  One resample draws n documents with replacement; both models are scored on that
  same resample, so what the documents share cancels. nats_*: float [n] per-document
  -sum log p; num_bytes: [n]. `indices` replaces the random resamples (e.g. all n**n,
  for an exact check). The interval is the percentile interval."""
  n = len(num_bytes)
  if not (len(nats_a) == len(nats_b) == n) or n == 0:
    raise ConfigError(
      f"paired bootstrap needs the same documents for both models, "
      f"got {len(nats_a)} and {len(nats_b)} scores for {n} documents"
    )
  _check_confidence(confidence)
  if indices is None:
    if num_resamples < 1:
      raise ConfigError(f"num_resamples={num_resamples} must be >= 1")
    indices = resample_indices(n, num_resamples, seed)
  samples = resampled_differences(nats_a, nats_b, num_bytes, indices)
  point = resampled_differences(nats_a, nats_b, num_bytes, np.arange(n)[None])[0]
  tail = 100 * (1 - confidence) / 2
  low, high = np.percentile(samples, [tail, 100 - tail])
  return BootstrapDifference(
    float(point),
    float(samples.mean()),
    float(samples.std()),
    float(low),
    float(high),
    confidence,
    len(samples),
    n,
  )


def slope(x, y, *, confidence: float = 0.95, null: float = 0.0) -> Interval:
  """Least-squares slope of y on x with its t-interval (n - 2 df) and p against `null`;
  std is the slope's standard error. Needs at least 2 distinct x; n = 2 has no interval."""
  _check_confidence(confidence)
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != y.shape or x.ndim != 1 or np.unique(x).size < 2:
    raise ValueError(
      f"slope needs matching 1-d x and y with >= 2 distinct x, got shapes {x.shape}, {y.shape}"
    )
  fit = scipy.stats.linregress(x, y)
  if x.size == 2:
    return Interval(2, float(fit.slope), None, None, None)
  df = x.size - 2
  # a constant y is an exact line of slope 0 (linregress gives its stderr as nan: 0 / 0)
  stderr = 0.0 if np.all(y == y[0]) else float(fit.stderr)
  half = float(scipy.stats.t.ppf(0.5 + confidence / 2, df)) * stderr
  if stderr == 0:
    p = 1.0 if fit.slope == null else 0.0
  else:
    p = float(2 * scipy.stats.t.sf(abs(fit.slope - null) / stderr, df))
  return Interval(
    int(x.size), float(fit.slope), stderr, float(fit.slope) - half, float(fit.slope) + half, p
  )


def holm(p_values) -> list[float | None]:
  """Holm's step-down adjusted p-values (monotone, capped at 1), in the input order;
  None entries (no test) stay None and do not count towards the family."""
  present = [(p, i) for i, p in enumerate(p_values) if p is not None]
  m = len(present)
  adjusted: list[float | None] = [None] * len(p_values)
  running = 0.0
  for rank, (p, i) in enumerate(sorted(present)):
    running = max(running, min(1.0, (m - rank) * p))
    adjusted[i] = running
  return adjusted


def verdict(
  interval: Interval,
  expect: str | None,
  *,
  null: float = 0.0,
  fmt: str = "{:.3g}",
  unit: str = "draws",
) -> str:
  """The verdict words for one interval (module doc)."""
  if expect not in DIRECTIONS:
    raise ConfigError(f"expect={expect!r} must be 'lower', 'higher' or None")
  if interval.exact_zero:
    return f"identical on all {interval.n} {unit}"
  if interval.lo is None or interval.hi is None:
    return f"interval undefined (n={interval.n})"
  side = "lower" if interval.hi < null else "higher" if interval.lo > null else None
  if side is None:
    return (
      f"no detectable difference (|delta| < "
      f"{fmt.format(max(null - interval.lo, interval.hi - null))})"
    )
  if expect is None:
    return f"differs ({side})"
  return "reproduces" if side == expect else "opposite direction"


def format_interval(interval: Interval, fmt: str = "{:+.4f}") -> str:
  """'mean ± std [lo, hi]', or the mean alone where the interval is undefined."""
  if interval.lo is None:
    return fmt.format(interval.mean)
  spread = fmt.replace("+", "").format(interval.std)
  return (
    f"{fmt.format(interval.mean)} ± {spread} [{fmt.format(interval.lo)}, {fmt.format(interval.hi)}]"
  )


def markdown_table(header, rows) -> str:
  """A GitHub markdown table: `header` a list of column names, `rows` lists of cells
  (each turned to text with str; '|' inside a cell is escaped)."""
  header = [str(h) for h in header]

  def cell(value):
    return str(value).replace("|", "\\|").replace("\n", " ")

  lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
  for row in rows:
    row = list(row)
    if len(row) != len(header):
      raise ValueError(f"a row has {len(row)} cells for {len(header)} columns: {row}")
    lines.append("| " + " | ".join(map(cell, row)) + " |")
  return "\n".join(lines)
