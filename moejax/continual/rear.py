"""FlyPrompt's two non-gradient parts (ICLR 2026, arXiv 2602.01976): the random expanded
analytic router (REAR) and the temporal ensemble of expert heads (TE^2), as pure
functions over explicit numpy state.

REAR, for a frozen CLS feature f in R^d (the formulas of our spec and the official
code; the paper's section and equation numbers were not checked against its text):

    h = ReLU(f W_rand)                   W_rand [d, M] fixed, entries N(0, 1)
    G <- G + h^T h,  Q <- Q + h^T Y      Y: one-hot of the expert (the task) of each row
    W = (G + gamma I)^-1 Q               ridge regression on everything collected
    route(f) = argmax_e (h W)_e

so the online statistics after any stream give the same W as batch ridge on all rows
at once, in any order (G and Q are sums). M = 0 means no expansion: h = f (linear
ridge on the feature). The paper uses d = 768, M = 10000, gamma = 10^4; the official
code (AnAppleCore/FlyGCL, models/flyprompt.py RPFC) solves in float32 and draws
W_rand from torch.randn; here G and Q are float64 and W_rand comes from numpy's
default_rng(seed) (our choice: the router is a least-squares solve, float64 keeps it
exactly order-independent up to rounding).

TE^2 (temporal ensemble of experts): each expert e keeps, besides the one online head
theta (trained by gradient), EMA heads for decays r in (0.9, 0.99),

    theta_e,r <- r theta_e,r + (1 - r) theta       after every optimizer step on e

started from the online head when expert e starts (the official init_fc), so after n
steps theta_e,r = r^n theta_0 + (1 - r) sum_{k=1..n} r^(n-k) theta_k. At inference
the prediction is the elementwise max over the heads (online and expert e's EMA
heads) of their softmax probabilities (the official 'softmax_max_prob').
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from moejax.errors import ConfigError


class RidgeState(NamedTuple):
  """W_rand [d, M] (empty [d, 0] for M = 0), G [M', M'], Q [M', E], M' = M or d."""

  w_rand: np.ndarray
  gram: np.ndarray
  targets: np.ndarray


def _number(name: str, value, low: float, high: float | None = None, closed_high=False) -> float:
  """`value` as a float, or a one-line ConfigError naming `name` outside [low, high)."""
  bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low
  if not bad and high is not None:
    bad = value > high if closed_high else value >= high
  if bad:
    where = f">= {low}" if high is None else f"in [{low}, {high}{']' if closed_high else ')'}"
    raise ConfigError(f"{name}={value!r} must be a number {where}")
  return float(value)


def _count(name: str, value, low: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise ConfigError(f"{name}={value!r} must be an int >= {low}")
  return value


@dataclasses.dataclass(frozen=True)
class RandomExpandedRidgeRouter:
  """REAR (module doc): `features` d, `width` M (0: h = f), `ridge` gamma >= 0,
  `experts` E, W_rand from default_rng(`seed`). ConfigError naming `prefix`.<key>
  for a bad setting (gamma = 0 is plain least squares, fine once G is invertible)."""

  features: int
  width: int
  ridge: float
  experts: int
  seed: int = 0
  prefix: str = "router"

  def __post_init__(self):
    _count(f"{self.prefix}.features", self.features, 1)
    _count(f"{self.prefix}.width", self.width, 0)
    _number(f"{self.prefix}.ridge", self.ridge, 0.0)
    _count(f"{self.prefix}.experts", self.experts, 1)

  @property
  def expanded(self) -> int:
    """M', the length of h."""
    return self.width or self.features

  def init(self) -> RidgeState:
    """Nothing collected yet: G = 0, Q = 0, a fresh W_rand."""
    rng = np.random.default_rng(self.seed)
    w_rand = rng.standard_normal((self.features, self.width))
    m = self.expanded
    return RidgeState(w_rand, np.zeros((m, m)), np.zeros((m, self.experts)))

  def expand(self, state: RidgeState, features_BxD) -> np.ndarray:
    """h [B, M'] in float64: ReLU(f W_rand), or f itself for M = 0."""
    f = np.asarray(features_BxD, np.float64)
    if f.ndim != 2 or f.shape[1] != self.features:
      raise ConfigError(f"{self.prefix}: features of shape {f.shape} must be [B, {self.features}]")
    return f if self.width == 0 else np.maximum(f @ state.w_rand, 0.0)

  def collect(self, state: RidgeState, features_BxD, experts_B) -> RidgeState:
    """G + h^T h, Q + h^T Y for rows of frozen features and their experts (task ids)."""
    e = np.asarray(experts_B)
    if e.shape != (len(features_BxD),) or e.size and not (0 <= e.min() and e.max() < self.experts):
      raise ConfigError(
        f"{self.prefix}: experts {e.tolist()} must be one per row, in [0, {self.experts})"
      )
    h = self.expand(state, features_BxD)
    y = np.eye(self.experts)[e]
    return state._replace(gram=state.gram + h.T @ h, targets=state.targets + h.T @ y)

  def solve(self, state: RidgeState) -> np.ndarray:
    """W [M', E] = (G + gamma I)^-1 Q (the official update)."""
    return np.linalg.solve(state.gram + self.ridge * np.eye(self.expanded), state.targets)

  def scores(self, state: RidgeState, weights_MxE, features_BxD) -> np.ndarray:
    """h W [B, E]."""
    return self.expand(state, features_BxD) @ weights_MxE

  def route(self, state: RidgeState, weights_MxE, features_BxD, seen: int | None = None):
    """[B] argmax_e (h W)_e, over the first `seen` experts when given (the official
    code's router head has all E outputs; an expert not yet collected scores 0)."""
    s = self.scores(state, weights_MxE, features_BxD)
    return np.argmax(s if seen is None else s[:, :seen], axis=-1)


def matched_ridge(ridge: float, router: RandomExpandedRidgeRouter, state, reference, ref_state):
  """gamma' = gamma (tr G / M') / (tr G_ref / M'_ref): a ridge for `router` as strong,
  relative to the mean diagonal of its G, as `ridge` is for `reference`'s G (our
  baseline, not the paper's: ridge without expansion at the paper's gamma is far more
  regularised than REAR, as the expansion scales G up)."""
  own = np.trace(state.gram) / router.expanded
  other = np.trace(ref_state.gram) / reference.expanded
  return float(ridge * own / other) if other > 0 else float(ridge)


class HeadBank(NamedTuple):
  """EMA heads: kernel [E, R, d, C], bias [E, R, C] (R decays)."""

  kernel: np.ndarray
  bias: np.ndarray


@dataclasses.dataclass(frozen=True)
class EMAHeadBank:
  """TE^2 (module doc): `experts` E, each with one EMA head per decay in `decays`
  (each in [0, 1)); ConfigError naming `prefix`.decays[i] otherwise."""

  experts: int
  decays: tuple[float, ...] = (0.9, 0.99)
  prefix: str = "te2"

  def __post_init__(self):
    _count(f"{self.prefix}.experts", self.experts, 1)
    if not isinstance(self.decays, (tuple, list)) or not self.decays:
      raise ConfigError(f"{self.prefix}.decays={self.decays!r} must be a non-empty sequence")
    for i, r in enumerate(self.decays):
      _number(f"{self.prefix}.decays[{i}]", r, 0.0, 1.0)

  def init(self, kernel_DxC, bias_C) -> HeadBank:
    """Every expert's EMA heads equal to the online head (kernel [d, C], bias [C])."""
    k, b = np.asarray(kernel_DxC, np.float32), np.asarray(bias_C, np.float32)
    r = len(self.decays)
    return HeadBank(
      np.broadcast_to(k, (self.experts, r, *k.shape)).copy(),
      np.broadcast_to(b, (self.experts, r, *b.shape)).copy(),
    )

  def start(self, bank: HeadBank, expert: int, kernel_DxC, bias_C) -> HeadBank:
    """Expert `expert`'s EMA heads reset to the online head (a new expert starts)."""
    kernel, bias = bank.kernel.copy(), bank.bias.copy()
    kernel[expert], bias[expert] = np.asarray(kernel_DxC), np.asarray(bias_C)
    return HeadBank(kernel, bias)

  def update(self, bank: HeadBank, expert: int, kernel_DxC, bias_C) -> HeadBank:
    """theta_e,r <- r theta_e,r + (1 - r) theta for expert `expert` (one step)."""
    r = np.asarray(self.decays, np.float32)
    kernel, bias = bank.kernel.copy(), bank.bias.copy()
    kernel[expert] = r[:, None, None] * kernel[expert] + (1 - r[:, None, None]) * kernel_DxC
    bias[expert] = r[:, None] * bias[expert] + (1 - r[:, None]) * bias_C
    return HeadBank(kernel, bias)

  def logits(self, bank: HeadBank, experts_B, features_BxD) -> np.ndarray:
    """[R, B, C]: each row's EMA heads of its expert on its feature."""
    e, f = np.asarray(experts_B), np.asarray(features_BxD, np.float32)
    return np.einsum("bd,brdc->rbc", f, bank.kernel[e]) + np.moveaxis(bank.bias[e], 1, 0)


def softmax(logits, axis: int = -1) -> np.ndarray:
  z = np.asarray(logits, np.float64)
  z = np.exp(z - z.max(axis=axis, keepdims=True))
  return z / z.sum(axis=axis, keepdims=True)


def max_of_softmaxes(logits_HxBxC) -> np.ndarray:
  """[B, C]: the elementwise max over heads of softmax(logits) (TE^2's combination)."""
  return softmax(logits_HxBxC).max(axis=0)
