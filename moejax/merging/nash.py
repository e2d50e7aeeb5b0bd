"""Nash-bargaining merge of task vectors (NAMEx, arXiv 2510.16138, eqs. 7-9; the
bargaining solution of Nash-MTL, Navon et al. 2022, Thm. 3.1).

For task vectors tau_i = theta_i - base stacked as the columns of G, each model
bargains for an update direction d with utility log(d^T tau_i). The solution of

    max_d  sum_i p_i log(d^T tau_i)   over a ball around 0

is d = G alpha with alpha > 0 solving  (G^T G) alpha = p / alpha, the minimiser of
the convex  1/2 alpha^T K alpha - sum_i p_i log alpha_i  (K = G^T G); then
d^T tau_j = p_j / alpha_j > 0 for every j: every model gains. With orthogonal task
vectors alpha_j = sqrt(p_j) / ||tau_j||, so d sums unit directions.

    theta = base + scale * G alpha

Here p_i = n w_i: uniform merge weights (the default) give the paper's symmetric
game (p = 1); other simplex weights are bargaining powers (the asymmetric Nash
solution, our extension). The ball's radius is not the paper's concern at merge
time: `scale` plays NAMEx's step size gamma, in units of parameter norm (a guess:
the paper's value for merging whole models is not stated). A model equal to the
base (or of weight 0) takes no part. Where a non-negative combination of the
task vectors is 0 (e.g. tau_2 = -tau_1) no direction improves every model and the
game has no solution: a ConfigError names the models.

Arithmetic is float64 over the whole model (one Gram matrix over all leaves).
"""

import numpy as np

from moejax.errors import ConfigError
from moejax.merging.base import finite_number, leaves, map_paths, register_merge

MAX_NEWTON_STEPS = 100
TOLERANCE = 1e-12  # relative residual |K alpha - p / alpha| / (p / alpha)


def nash_weights(
  gram, powers=None, *, max_steps: int = MAX_NEWTON_STEPS, tolerance: float = TOLERANCE
) -> np.ndarray:
  """alpha > 0 with gram @ alpha = powers / alpha (powers default 1): damped Newton on
  f(alpha) = 1/2 alpha^T K alpha - sum p log alpha, whose Hessian K + diag(p / alpha^2)
  is positive definite, from the orthogonal solution sqrt(p / diag K).

  ValueError when f is unbounded below (a non-negative combination of the task
  vectors is 0) or a diagonal entry is not positive."""
  k = np.asarray(gram, np.float64)
  p = np.ones(k.shape[0]) if powers is None else np.asarray(powers, np.float64)
  if np.any(np.diag(k) <= 0):
    raise ValueError("every task vector must be nonzero")
  alpha = np.sqrt(p / np.diag(k))

  def objective(a):
    return 0.5 * a @ k @ a - p @ np.log(a)

  for _ in range(max_steps):
    gradient = k @ alpha - p / alpha
    if np.max(np.abs(gradient) / (p / alpha)) <= tolerance:
      return alpha
    hessian = k + np.diag(p / alpha**2)
    try:
      step = np.linalg.solve(hessian, gradient)
    except np.linalg.LinAlgError:  # alpha diverged: K + diag(p / alpha^2) is numerically K
      break
    t, value = 1.0, objective(alpha)
    slack = 1e-12 * (1.0 + abs(value))  # near the optimum f changes below rounding
    while np.any(alpha - t * step <= 0) or objective(alpha - t * step) > value + slack:
      t *= 0.5
      if t < 1e-30:
        break
    alpha = alpha - t * step
    if not np.all(np.isfinite(alpha)) or alpha.max() > 1e150:
      break
  raise ValueError(
    "no bargaining solution: a non-negative combination of the task vectors "
    "is (nearly) 0, so no direction improves every model"
  )


def _validate(settings: dict) -> None:
  finite_number(settings, "scale", low=0.0, low_open=True)


@register_merge("nash", settings={"scale": 1.0}, validate=_validate, simplex=True)
def nash(base, models, weights, settings):
  """base + scale * G alpha over the models whose task vector is nonzero."""
  base_leaves = [np.asarray(leaf, np.float64) for _, leaf in leaves(base)]
  taus = [
    np.concatenate(
      [
        (np.asarray(leaf, np.float64) - b).reshape(-1)
        for (_, leaf), b in zip(leaves(m), base_leaves)
      ]
    )
    for m in models
  ]
  taking_part = [i for i, tau in enumerate(taus) if np.any(tau != 0) and weights[i] > 0]
  coefficients = np.zeros(len(models))
  if taking_part:
    g = np.stack([taus[i] for i in taking_part], axis=1)
    powers = len(models) * np.asarray(weights, np.float64)[taking_part]
    try:
      coefficients[taking_part] = nash_weights(g.T @ g, powers)
    except ValueError as error:
      names = ", ".join(f"models[{i}]" for i in taking_part)
      raise ConfigError(f"--method=nash over {names}: {error}") from None
  scale = float(settings["scale"])
  return map_paths(
    lambda _, b, ms: b + scale * sum(c * (m - b) for c, m in zip(coefficients, ms)), base, models
  )
