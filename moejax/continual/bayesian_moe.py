"""The calibrated Bayesian mixture of experts for continual VQA (ICML 2026, abstract only):
its routing objective, Bayesian model averaging and the calibration error, as functions.

Per-task experts e = 1..E answer in one answer space, p_e(a|x). The router q(e|x) is
learned by maximising the expected utility with an entropy bonus

    U(q) = sum_e q(e|x) u(y_e, y) + lambda H(q),      H(q) = -sum_e q(e|x) log q(e|x)

whose maximiser over the simplex is q* = softmax(u / lambda) (U = -lambda KL(q || q*)
+ const); lambda = 0 is the utility alone, maximised by all mass on argmax_e u (on
ties, any split among them; `optimal_routing` puts equal mass on each). At inference
the expert identity is marginalised (Bayesian model averaging):

    p(a|x) = sum_e q(e|x) p_e(a|x).

Guesses (the abstract gives neither): the utility u(y_e, y) is the VQA accuracy of the
expert's answer, 1[argmax_a p_e(a|x) = y] (one annotator, so VQA accuracy is 0/1);
the router is a linear map of a frozen feature to logits (zero-initialised: uniform q),
trained full-batch. The hard task-id baseline is the same linear map trained by
cross-entropy to the task id and routed by its argmax (one-hot q).

ECE (Guo et al. 2017, sec. 2): the confidence max_a p(a|x) binned into `n_bins`
equal-width bins (k/n, (k+1)/n] (a confidence of exactly 0 in the first), ECE =
sum_b |B_b| / N |accuracy(B_b) - mean confidence(B_b)|, the prediction argmax_a p(a|x).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from moejax.errors import ConfigError

MASKED = -1e9  # the logit of an expert not trained yet


def check_lam(lam, key: str = "lam") -> float:
  """lambda as a float; one-line ConfigError naming `key` unless a number >= 0."""
  if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam >= 0:
    raise ConfigError(f"{key}={lam!r} must be a number >= 0 (the entropy weight lambda)")
  return float(lam)


def check_bins(n_bins, key: str = "n_bins") -> int:
  if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
    raise ConfigError(f"{key}={n_bins!r} must be an int >= 1")
  return n_bins


def entropy(q_NxE):
  """H(q) per row [N], float32 (0 log 0 = 0)."""
  q = jnp.asarray(q_NxE, jnp.float32)
  return -jnp.sum(jnp.where(q > 0, q * jnp.log(jnp.where(q > 0, q, 1.0)), 0.0), axis=-1)


def expected_utility(q_NxE, u_NxE, lam: float):
  """U averaged over rows (module doc), float32."""
  q, u = jnp.asarray(q_NxE, jnp.float32), jnp.asarray(u_NxE, jnp.float32)
  return jnp.mean(jnp.sum(q * u, axis=-1) + lam * entropy(q))


def optimal_routing(u_NxE, lam: float, available_E=None) -> np.ndarray:
  """q* [N, E] (float32) maximising U row by row: softmax(u / lambda), or for lambda = 0
  equal mass on each expert of the largest utility; unavailable experts get 0."""
  lam = check_lam(lam)
  u = np.asarray(u_NxE, np.float64)
  available = np.ones(u.shape[-1], bool) if available_E is None else np.asarray(available_E)
  u = np.where(available, u, -np.inf)
  if lam == 0:
    best = u == u.max(-1, keepdims=True)
    return (best / best.sum(-1, keepdims=True)).astype(np.float32)
  z = u / lam
  z = np.exp(z - z.max(-1, keepdims=True))
  return (z / z.sum(-1, keepdims=True)).astype(np.float32)


def accuracy_utilities(probs_ExNxA, labels_N) -> np.ndarray:
  """u [N, E]: 1 where expert e's answer argmax_a p_e(a|x) is the label, else 0."""
  answers = np.argmax(np.asarray(probs_ExNxA), axis=-1)
  return (answers == np.asarray(labels_N)[None]).T.astype(np.float32)


def bma(q_NxE, probs_ExNxA) -> np.ndarray:
  """p(a|x) = sum_e q(e|x) p_e(a|x), [N, A] float32."""
  q, p = np.asarray(q_NxE, np.float32), np.asarray(probs_ExNxA, np.float32)
  if p.shape[:2] != q.shape[::-1]:
    raise ValueError(f"routing {q.shape} [N, E] does not match expert answers {p.shape} [E, N, A]")
  return np.einsum("ne,ena->na", q, p)


def hard_routing(scores_NxE) -> np.ndarray:
  """One-hot q [N, E] on the argmax of each row (the lower index on ties)."""
  scores = np.asarray(scores_NxE)
  return np.eye(scores.shape[-1], dtype=np.float32)[np.argmax(scores, axis=-1)]


def ece(probs_NxA, labels_N, n_bins: int = 15) -> float:
  """Expected calibration error with equal-width confidence bins (module doc)."""
  n_bins = check_bins(n_bins)
  p = np.asarray(probs_NxA, np.float64)
  confidence, correct = p.max(-1), p.argmax(-1) == np.asarray(labels_N)
  bins = np.clip(np.ceil(confidence * n_bins).astype(int) - 1, 0, n_bins - 1)
  total = 0.0
  for b in range(n_bins):
    rows = bins == b
    if rows.any():
      total += rows.mean() * abs(correct[rows].mean() - confidence[rows].mean())
  return float(total)


class Router(nnx.Module):
  """q(e|x) = softmax of a linear map of a frozen feature [N, d] over `experts`, float32;
  zero-initialised, so every available expert starts equally likely."""

  def __init__(self, d: int, experts: int):
    self.kernel = nnx.Param(jnp.zeros((d, experts), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((experts,), jnp.float32))

  def __call__(self, features_NxD, available_E=None):
    """Log q [N, E]; experts outside `available_E` (bool [E]) get probability 0."""
    logits = jnp.asarray(features_NxD, jnp.float32) @ self.kernel[...] + self.bias[...]
    if available_E is not None:
      logits = jnp.where(jnp.asarray(available_E), logits, MASKED)
    return jax.nn.log_softmax(logits, axis=-1)


def negative_utility(log_q, u, lam, target, weight):
  """-U of the router's q against utilities u [N, E] (the objective it ascends), the
  mean over rows weighted by `weight` [N]."""
  q = jnp.exp(log_q)
  per_row = jnp.sum(q * u, axis=-1) - lam * jnp.sum(q * log_q, axis=-1)
  return -jnp.sum(weight * per_row) / jnp.sum(weight)


def task_cross_entropy(log_q, u, lam, target, weight):
  """Cross-entropy of the router's q to the task id (the hard baseline's training)."""
  per_row = jnp.take_along_axis(log_q, target[:, None], axis=-1)[:, 0]
  return -jnp.sum(weight * per_row) / jnp.sum(weight)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _fitted(graphdef, objective, optimizer, steps, params, features, available, *args):
  """`steps` full-batch optimizer steps on objective(log q, *args)."""

  def loss(p):
    return objective(nnx.merge(graphdef, p)(features, available), *args)

  def step(carry, _):
    p, state = carry
    updates, state = optimizer.update(jax.grad(loss)(p), state, p)
    return (optax.apply_updates(p, updates), state), None

  (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), None, length=steps)
  return params


def fit_router(
  router: Router, features_NxD, available_E, optimizer, steps: int, *, utilities=None,
  lam: float = 0.0, tasks=None, rows_N=None,
) -> Router:  # fmt: skip
  """The router after `steps` full-batch steps of `optimizer`: ascending U (utilities
  [N, E], entropy weight lam; the method and its lambda = 0 ablation) or, given `tasks`
  [N] instead, descending the cross-entropy to the task id (the hard baseline); over
  the rows `rows_N` (bool [N]) selects, every row by default (a fixed shape, one compile)."""
  lam = check_lam(lam)
  if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
    raise ConfigError(f"router steps={steps!r} must be an int >= 0")
  if (utilities is None) == (tasks is None):
    raise ValueError("fit_router takes utilities (the utility router) or tasks (the task router)")
  features = jnp.asarray(features_NxD, jnp.float32)
  n, e = features.shape[0], router.bias.shape[0]
  u = jnp.zeros((n, e), jnp.float32) if utilities is None else jnp.asarray(utilities, jnp.float32)
  target = jnp.zeros((n,), jnp.int32) if tasks is None else jnp.asarray(tasks, jnp.int32)
  weight = jnp.asarray(np.ones(n) if rows_N is None else rows_N, jnp.float32)
  objective = negative_utility if tasks is None else task_cross_entropy
  graphdef, params = nnx.split(router)
  available = jnp.asarray(np.ones(e, bool) if available_E is None else available_E)
  params = _fitted(
    graphdef, objective, optimizer, steps, params, features, available, u, jnp.float32(lam),
    target, weight,
  )  # fmt: skip
  return nnx.merge(graphdef, params)


def routing_of(router: Router, features_NxD, available_E=None) -> np.ndarray:
  """q [N, E] of a trained router, float32 numpy."""
  return np.asarray(jnp.exp(router(features_NxD, available_E)))
