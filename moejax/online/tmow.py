"""TMoW, the Test-time Mixture of World Models (Jang et al., ICLR 2026; arXiv
2601.22647; abstract only): the machinery of a synthetic linear-dynamics study.

Known from the abstract (spec entry 19): experts are domain world models; a
router compares features z with per-domain prototypes c_d,
    w_d = softmax_d(cos(z, c_d) / tau)                       (moejax/routing/prototype.py);
test-time refinement gives an unseen domain a prototype interpolated from the
existing ones by similarity; distilled augmentation adds an expert distilled
from the current mixture on few-shot data, whose prototype is the mean feature.

Our setting (ours, not the paper's):
  * domain d: x' = A_d x + sigma eps, eps ~ N(0, I_n), A_d = radius G / |G|_2
    with G Gaussian (`stable_matrices`: spectral norm radius < 1, so stable);
    states x ~ N(0, I_n) iid (transitions from a replay buffer of random states);
  * features (our choice): z = vec(x' x^T), a fixed map of one transition,
    z[i * n + j] = x'_i x_j. With x ~ N(0, I) its mean is vec(A_d), so a
    prototype (the mean feature of a domain) estimates the domain's dynamics.
    The state alone would not do: every domain has the same state law, so the
    mean states (prototypes) would all be 0;
  * experts: per-domain least squares (`fit_expert`);
  * error: the expected next-state MSE over the noise floor sigma^2, exactly
    E|A_hat x - x'|^2 / (n sigma^2) - 1 = |A_hat - A|_F^2 / (n sigma^2)
    for x ~ N(0, I) (`excess_mse`).

`unseen_domain_errors` is one replicate of the study (configs/studies/tmow.py):
training domains, then unseen mixture domains scored by every method of METHODS.

GUESSES, marked where used: refinement weights are the router's softmax at the
unseen domain's *mean* feature (`refine_prototype`); the mixture's world model
is sum_d w_d A_d (linear experts, so mixing outputs = mixing matrices); the
distillation (`add_expert`) is a ridge fit to the few-shot data centred on the
mixture (module doc of add_expert).
"""

from typing import NamedTuple

import jax
import numpy as np

from moejax.errors import ConfigError
from moejax.routing.prototype import check_tau, cosine_logits, prototype_routing


class WorldModels(NamedTuple):
  """A mixture of linear world models: expert e predicts x' = experts[e] @ x."""

  experts: np.ndarray  # [E, n, n]
  prototypes: np.ndarray  # [E, n * n], the mean feature of each expert's domain


def _positive(name: str, value, *, allow_zero: bool = False) -> None:
  ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
  ok = ok and np.isfinite(value) and (value >= 0 if allow_zero else value > 0)
  if not ok:
    raise ConfigError(f"{name}={value!r} must be a finite number {'>=' if allow_zero else '>'} 0")


def _count(name: str, value, low: int = 1) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
    raise ConfigError(f"{name}={value!r} must be an integer >= {low}")


def _pairs(x, x_next) -> tuple[np.ndarray, np.ndarray]:
  """x, x_next as float64 [K, n] of one shape, or ConfigError naming the shapes."""
  x, x_next = np.asarray(x, np.float64), np.asarray(x_next, np.float64)
  if x.ndim != 2 or x.shape != x_next.shape or x.shape[0] < 1:
    raise ConfigError(
      f"transitions must be states x [K, n] and next states [K, n] with K >= 1 "
      f"(x shape {x.shape}, x_next shape {x_next.shape})"
    )
  return x, x_next


def stable_matrices(
  rng: np.random.Generator, count: int, dim: int, radius: float = 0.9
) -> np.ndarray:
  """[count, dim, dim] random matrices of spectral norm `radius` < 1 (stable)."""
  _count("count", count)
  _count("dim", dim)
  if not (isinstance(radius, (int, float)) and 0 < radius < 1):
    raise ConfigError(f"radius={radius!r} must be in (0, 1) (a stable spectral norm)")
  g = rng.standard_normal((count, dim, dim))
  return radius * g / np.linalg.norm(g, ord=2, axis=(1, 2))[:, None, None]


def mixture_matrix(matrices, weights) -> np.ndarray:
  """sum_d weights[d] A_d: the dynamics of a mixture domain, or the world model
  of a mixture of linear experts (mixing their outputs mixes their matrices)."""
  matrices, weights = np.asarray(matrices, np.float64), np.asarray(weights, np.float64)
  if matrices.ndim != 3 or weights.shape != matrices.shape[:1]:
    raise ConfigError(
      f"weights must be [E] for matrices [E, n, n] (weights shape "
      f"{weights.shape}, matrices shape {matrices.shape})"
    )
  return np.einsum("e,eij->ij", weights, matrices)


def transitions(rng: np.random.Generator, a, count: int, noise_std: float):
  """(x, x_next) [count, n]: x ~ N(0, I), x_next = A x + noise_std * N(0, I)."""
  _count("count", count)
  _positive("noise_std", noise_std)
  a = np.asarray(a, np.float64)
  x = rng.standard_normal((count, a.shape[0]))
  return x, x @ a.T + noise_std * rng.standard_normal(x.shape)


def features(x, x_next) -> np.ndarray:
  """z = vec(x' x^T) per transition, [K, n * n] (z[k, i n + j] = x'_{k,i} x_{k,j})."""
  x, x_next = _pairs(x, x_next)
  return np.einsum("ki,kj->kij", x_next, x).reshape(x.shape[0], -1)


def fit_expert(x, x_next, ridge: float = 0.0, prior=None) -> np.ndarray:
  """argmin_A sum_k |x'_k - A x_k|^2 + ridge |A - prior|_F^2 (prior 0 by default);
  plain least squares at ridge 0 (needs K >= n independent states)."""
  x, x_next = _pairs(x, x_next)
  _positive("ridge", ridge, allow_zero=True)
  n = x.shape[1]
  prior = np.zeros((n, n)) if prior is None else np.asarray(prior, np.float64)
  if prior.shape != (n, n):
    raise ConfigError(f"prior must be [n, n] = [{n}, {n}] (prior shape {prior.shape})")
  gram = x.T @ x + ridge * np.eye(n)
  if np.linalg.matrix_rank(gram) < n:
    raise ConfigError(
      f"fit_expert needs ridge > 0 or K >= n={n} independent states (K={x.shape[0]}, ridge={ridge})"
    )
  return np.linalg.solve(gram, x.T @ x_next + ridge * prior.T).T


def train_world_models(domains) -> WorldModels:
  """One least-squares expert per domain [(x, x_next), ...]; prototypes = mean features."""
  if not domains:
    raise ConfigError("train_world_models needs at least one domain (domains=[])")
  return WorldModels(
    np.stack([fit_expert(x, y) for x, y in domains]),
    np.stack([features(x, y).mean(0) for x, y in domains]),
  )


def mean_feature(prototypes, z) -> np.ndarray:
  """The mean of features z [K, F] (or z itself, [F]) checked against prototypes [E, F]."""
  prototypes, z = np.asarray(prototypes, np.float64), np.asarray(z, np.float64)
  if (
    prototypes.ndim != 2
    or z.ndim not in (1, 2)
    or z.shape[-1] != prototypes.shape[1]
    or (z.size == 0)
  ):
    raise ConfigError(
      f"features must be [K, F] or [F] with F={prototypes.shape[-1]} of the "
      f"prototypes [E, F] (features shape {z.shape}, prototypes shape "
      f"{prototypes.shape})"
    )
  return z.mean(0) if z.ndim == 2 else z


# The router's functions, compiled once per shape and setting: the studies route one
# mean feature at a time, thousands of times, where op-by-op dispatch would dominate.
_cosine_logits = jax.jit(cosine_logits, static_argnums=2)
_prototype_routing = jax.jit(prototype_routing, static_argnums=(2, 3, 4))


def route_weights(prototypes, z, tau: float, top_k: int | None = None) -> np.ndarray:
  """Dense routing weights [E] of the mean feature of z: softmax(cos / tau) over all
  experts (top_k None), or the router's renormalised top_k of it."""
  check_tau(tau)
  zbar = mean_feature(prototypes, z)[None]
  prototypes = np.asarray(prototypes, np.float32)
  if top_k is None:
    logits = np.asarray(_cosine_logits(zbar, prototypes, float(tau)), np.float64)[0]
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()
  routing, _ = _prototype_routing(zbar, prototypes, float(tau), top_k, True)
  weights = np.zeros(len(prototypes))
  weights[np.asarray(routing.expert_index[0])] = np.asarray(routing.combine_weight[0])
  return weights


def refine_prototype(prototypes, z_unseen, tau: float) -> tuple[np.ndarray, np.ndarray]:
  """Test-time refinement: (c_new [F], w [E]) with w = softmax(cos(z_bar, c) / tau)
  at the mean unseen feature z_bar and c_new = sum_d w_d c_d, a convex combination
  of the prototypes (GUESS: the paper's interpolation weights are not known)."""
  check_tau(tau)
  weights = route_weights(prototypes, z_unseen, tau)
  return weights @ np.asarray(prototypes, np.float64), weights


def add_expert(
  models: WorldModels, x, x_next, tau: float, strength: float = 1.0, teacher_weights=None
) -> tuple[WorldModels, np.ndarray]:
  """Distilled augmentation: (models with one more expert, the teacher's weights).

  The teacher is the current mixture at the few-shot data, A_mix = sum_d w_d A_d
  with w = refine_prototype's weights (or `teacher_weights`). The new expert
  (GUESS) minimises
      sum_k |x'_k - A x_k|^2 + strength * E_{u ~ N(0, I)} |A_mix u - A u|^2,
  the few-shot data plus distillation of the mixture's predictions on the state
  distribution; as E|(A_mix - A) u|^2 = |A_mix - A|_F^2, it is the mixture plus a
  ridge fit of the residual x' - A_mix x (fit_expert with prior A_mix). Its
  prototype is the mean few-shot feature; the old experts and prototypes are kept.
  """
  x, x_next = _pairs(x, x_next)
  _positive("strength", strength, allow_zero=True)
  if teacher_weights is None:
    _, teacher_weights = refine_prototype(models.prototypes, features(x, x_next), tau)
  teacher = mixture_matrix(models.experts, teacher_weights)
  expert = fit_expert(x, x_next, ridge=strength, prior=teacher)
  return WorldModels(
    np.concatenate([models.experts, expert[None]]),
    np.concatenate([models.prototypes, features(x, x_next).mean(0)[None]]),
  ), np.asarray(teacher_weights, np.float64)


def predict(models: WorldModels, weights, x) -> np.ndarray:
  """Next states [K, n] of the mixture sum_e weights[e] experts[e] at states x [K, n]."""
  return np.asarray(x, np.float64) @ mixture_matrix(models.experts, weights).T


def excess_mse(a_hat, a_true, noise_std: float) -> float:
  """Expected next-state MSE over the noise floor, minus 1, for x ~ N(0, I):
  E|A_hat x - x'|^2 / (n noise_std^2) - 1 = |A_hat - A|_F^2 / (n noise_std^2)."""
  _positive("noise_std", noise_std)
  a_hat, a_true = np.asarray(a_hat, np.float64), np.asarray(a_true, np.float64)
  if a_hat.shape != a_true.shape or a_hat.ndim != 2:
    raise ConfigError(f"A_hat and A must be the same [n, n] (shapes {a_hat.shape}, {a_true.shape})")
  return float(np.sum(np.square(a_hat - a_true)) / (a_true.shape[0] * noise_std**2))


METHODS = {  # name: (setting, description), the methods `unseen_domain_errors` scores
  "global": ("zero-shot", "one global linear model (pooled least squares)"),
  "fixed_top1": ("zero-shot", "fixed prototypes, router top-1 (closest seen expert)"),
  "fixed_top2": ("zero-shot", "fixed prototypes, router top-2 (renormalised)"),
  "refined": ("zero-shot", "TMoW refined prototype: softmax(cos/tau) mixture"),
  "oracle_alpha": ("reference", "true alpha on the trained experts (not a method)"),
  "scratch": ("few-shot", "new expert fit from scratch (ridge toward 0)"),
  "global_prior": ("few-shot", "global model fine-tuned (ridge toward it)"),
  "distilled_fixed": ("few-shot", "new expert distilled from the top-1 expert"),
  "distilled": ("few-shot", "TMoW new expert, distilled from the refined mixture (domain known)"),
  "tmow_routed": (
    "few-shot",
    "TMoW mixture over D+1 prototypes, routed by K fresh transitions (domain unknown)",
  ),
}
DIAGNOSTICS = ("weight_on_new", "top1_is_new", "old_routing_kept")  # of tmow_routed


def check_settings(
  *, dim, domains, train, unseen, noise_std, radius, concentration, tau, strength
) -> None:
  """ConfigError, its message starting 'key=value', for the first unusable setting of
  `unseen_domain_errors`."""
  for name, value, low in (
    ("dim", dim, 1),
    ("domains", domains, 2),
    ("train", train, 1),
    ("unseen", unseen, 1),
  ):
    _count(name, value, low)
  for name, value in (("noise_std", noise_std), ("concentration", concentration), ("tau", tau)):
    _positive(name, value)
  _positive("strength", strength, allow_zero=True)
  if isinstance(radius, bool) or not (isinstance(radius, (int, float)) and 0 < radius < 1):
    raise ConfigError(f"radius={radius!r} must be in (0, 1) (a stable spectral norm)")


def unseen_domain_errors(
  rng: np.random.Generator,
  shots,
  taus=(),
  *,
  dim: int = 6,
  domains: int = 4,
  train: int = 500,
  unseen: int = 10,
  noise_std: float = 0.2,
  radius: float = 0.9,
  concentration: float = 1.0,
  tau: float = 0.3,
  strength: float = 4.0,
) -> dict:
  """One replicate of the unseen-domain study: {(key, K): mean over `unseen` domains}.

  `domains` training domains (stable_matrices, `train` transitions each) give one
  least-squares expert and one prototype each; each unseen domain A* = sum alpha_d A_d,
  alpha ~ Dirichlet(concentration), is seen through K transitions (K in `shots`, in
  that order, from the one stream `rng`). Keys: every METHODS name (excess_mse), the
  refined mixture at each temperature in `taus` ('tau=<t:g>') and DIAGNOSTICS: the
  routed mixture's weight on the new expert, whether it is top-1, and the fraction of
  fresh old-domain feature means whose top-1 expert is unchanged by the addition."""
  check_settings(
    dim=dim,
    domains=domains,
    train=train,
    unseen=unseen,
    noise_std=noise_std,
    radius=radius,
    concentration=concentration,
    tau=tau,
    strength=strength,
  )
  for k in shots:
    _count("shots", k)
  a = stable_matrices(rng, domains, dim, radius)
  data = [transitions(rng, a_d, train, noise_std) for a_d in a]
  models = train_world_models(data)
  pooled = fit_expert(np.concatenate([x for x, _ in data]), np.concatenate([y for _, y in data]))
  out: dict = {}

  def add(key, k, v):
    out.setdefault((key, k), []).append(float(v))

  for _ in range(unseen):
    alpha = rng.dirichlet(np.full(domains, concentration))
    truth = mixture_matrix(a, alpha)

    def err(m, truth=truth):
      return excess_mse(m, truth, noise_std)

    def mix(w, experts=models.experts):
      return mixture_matrix(experts, w)

    for k in shots:
      x, y = transitions(rng, truth, k, noise_std)
      z = features(x, y)
      top1 = route_weights(models.prototypes, z, tau, top_k=1)
      _, refined = refine_prototype(models.prototypes, z, tau)
      add("global", k, err(pooled))
      add("fixed_top1", k, err(mix(top1)))
      add("fixed_top2", k, err(mix(route_weights(models.prototypes, z, tau, top_k=2))))
      add("refined", k, err(mix(refined)))
      add("oracle_alpha", k, err(mix(alpha)))
      for t in taus:
        add(f"tau={t:g}", k, err(mix(refine_prototype(models.prototypes, z, t)[1])))
      add("scratch", k, err(fit_expert(x, y, ridge=strength)))
      add("global_prior", k, err(fit_expert(x, y, ridge=strength, prior=pooled)))
      add("distilled_fixed", k, err(add_expert(models, x, y, tau, strength, top1)[0].experts[-1]))
      grown, _ = add_expert(models, x, y, tau, strength, refined)
      add("distilled", k, err(grown.experts[-1]))
      routed = route_weights(
        grown.prototypes, features(*transitions(rng, truth, k, noise_std)), tau
      )
      add("tmow_routed", k, err(mix(routed, grown.experts)))
      add("weight_on_new", k, routed[-1])
      add("top1_is_new", k, np.argmax(routed) == len(routed) - 1)
      kept = [
        np.argmax(route_weights(grown.prototypes, zo, tau))
        == np.argmax(route_weights(models.prototypes, zo, tau))
        for zo in (features(*transitions(rng, a_d, k, noise_std)) for a_d in a)
      ]
      add("old_routing_kept", k, np.mean(kept))
  return {key: float(np.mean(v)) for key, v in out.items()}
