"""Paired multi-seed statistics that can say "reproduces" (issue 13, part 4).

Every arm of a sweep runs on the same seeds as the baseline arm; seed s fixes
initialisation and data order, so arm and baseline on seed s are a pair. For
an arm, d_s = metric(arm, s) - metric(baseline, s); the report gives the mean
of d, its sample std (ddof=1) and the 95% Student-t interval
mean ± t_{0.975, n-1} * std / sqrt(n). With n = 1 seed the interval is
undefined (no spread to estimate) and is reported as such, never as a number.

Verdicts (`verdict`), for an arm that declares the paper's expected direction
("lower" or "higher" than the baseline):
  reproduces                         the interval excludes 0 on the expected side
  opposite direction                 it excludes 0 on the other side
  no detectable difference (|delta| < X)   it holds 0; X = max(|lo|, |hi|), the
                                     largest difference the interval allows
  identical on all N seeds           the arms are equal on every seed
An arm with no expected direction gets "differs (lower|higher)" or the
no-detectable-difference verdict. scipy is not a dependency: the t quantile
comes from the closed-form Student-t CDF for integer degrees of freedom
(Abramowitz & Stegun 26.7.3-4) inverted by bisection, exact to float64.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from moejax.errors import ConfigError

DIRECTIONS = ("lower", "higher", None)


def t_abs_cdf(t: float, df: int) -> float:
  """P(|T| <= t) for Student's t with integer df >= 1 (A&S 26.7.3-4)."""
  theta = math.atan(t / math.sqrt(df))
  s, c2 = math.sin(theta), math.cos(theta) ** 2
  if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
    term, total = 1.0, 0.0
    for j in range(1, (df - 1) // 2 + 1):
      total += term
      term *= c2 * (2 * j) / (2 * j + 1)
    return 2 / math.pi * (theta + (s * math.cos(theta) * total if df > 1 else 0.0))
  term, total = 1.0, 0.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
  for j in range(1, df // 2 + 1):
    total += term
    term *= c2 * (2 * j - 1) / (2 * j)
  return s * total


def t_quantile(p: float, df: int) -> float:
  """The p-quantile (p in (0.5, 1)) of Student's t with integer df >= 1."""
  if not (isinstance(df, int) and df >= 1 and 0.5 < p < 1):
    raise ValueError(f"t_quantile needs p in (0.5, 1) and an int df >= 1, got {p}, {df}")
  target, lo, hi = 2 * p - 1, 0.0, 1.0
  while t_abs_cdf(hi, df) < target:
    hi *= 2
  for _ in range(200):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if t_abs_cdf(mid, df) < target else (lo, mid)
    if hi - lo <= 1e-15 * hi:
      break
  return (lo + hi) / 2


@dataclasses.dataclass(frozen=True)
class PairedDifference:
  """Mean, std and 95% t-interval of per-seed differences; lo/hi None when n = 1."""
  n: int
  mean: float
  std: float | None
  lo: float | None
  hi: float | None


def paired_difference(arm, baseline, confidence: float = 0.95) -> PairedDifference:
  """Statistics of arm[s] - baseline[s] over the seeds (same order in both)."""
  d = np.asarray(arm, np.float64) - np.asarray(baseline, np.float64)
  if d.ndim != 1 or d.size == 0:
    raise ValueError(f"need one value per seed in each arm, got shapes "
                     f"{np.shape(arm)} and {np.shape(baseline)}")
  mean = float(d.mean())
  if d.size == 1:
    return PairedDifference(1, mean, None, None, None)
  std = float(d.std(ddof=1))
  half = t_quantile(0.5 + confidence / 2, d.size - 1) * std / math.sqrt(d.size)
  return PairedDifference(int(d.size), mean, std, mean - half, mean + half)


def verdict(diff: PairedDifference, expect: str | None, fmt: str = "{:.3g}") -> str:
  """The verdict column for one arm (see module doc)."""
  if expect not in DIRECTIONS:
    raise ConfigError(f"expect={expect!r} must be 'lower', 'higher' or None")
  if diff.lo is None:
    return f"interval undefined (n={diff.n} seed)"
  if diff.lo == diff.hi == 0:
    return f"identical on all {diff.n} seeds"
  side = "lower" if diff.hi < 0 else "higher" if diff.lo > 0 else None
  if side is None:
    return f"no detectable difference (|delta| < {fmt.format(max(-diff.lo, diff.hi))})"
  if expect is None:
    return f"differs ({side})"
  return "reproduces" if side == expect else "opposite direction"


def check_seeds(seeds) -> tuple[int, ...]:
  """A sweep's `seeds`: non-empty, distinct ints in [0, 2**32); ConfigError otherwise."""
  if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
    raise ConfigError(f"seeds={seeds!r} must be a list of ints")
  seeds = tuple(seeds)
  if not seeds:
    raise ConfigError("seeds=() is empty; give at least one seed")
  if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**32
             for s in seeds):
    raise ConfigError(f"seeds={list(seeds)!r} must be ints in [0, 2**32)")
  twice = sorted({s for s in seeds if seeds.count(s) > 1})
  if twice:
    raise ConfigError(f"seeds={list(seeds)!r} gives seed {twice[0]} twice; each seed once")
  return seeds
