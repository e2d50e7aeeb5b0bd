"""OmniMoE's Cartesian product router (Shi et al. 2026, arXiv 2602.05711;
code: flash-algo/omni-moe, omni_moe/modules/omni_moe.py).

N = n x n atomic experts sit on a grid; expert (i, j) has flat index i * n + j
(the code's `indices_x * num_expert_sqrt + indices_y`). Two linear maps give
each token n row logits z_x and n column logits z_y; each is normalised by
BatchNorm without affine parameters, then log-softmaxed:
    lp_x = log_softmax(BN_x(z_x)),  lp_y = log_softmax(BN_y(z_y))
    score(i, j) = lp_x(i) + lp_y(j) = log p_x(i) p_y(j)          (product keys)
The router keeps the top_k pairs by score and weights each by
    w = exp(score) = p_x(i) p_y(j)
(no renormalisation; the weights of a token sum to at most 1).

Search (product keys, Lample et al. 2019): keep the top a = per_axis_k of each
axis (sorted, ranks r, c = 0..a-1), then the top_k of the candidate sums.
The pair at ranks (r, c) scores at most every pair at ranks (r' <= r, c' <= c),
so when (r + 1)(c + 1) > top_k at least top_k pairs beat it and it is never
needed: only the pairs with (r + 1)(c + 1) <= top_k are candidates (about
top_k ln top_k of them; 119 instead of 1024 for top_k = a = 32). The search
is exact whenever a >= min(top_k, n), since ranks >= top_k never qualify.
The official code does the exhaustive top_k over all N sums (its Triton
kernel; its PyTorch reference keeps a = n and all a^2 pairs); the result is
the same (up to ties), at O(n + top_k log top_k) instead of O(N) per token.

BatchNorm at eval / decode (our choice, which is also PyTorch BatchNorm1d's,
i.e. what the official module does in .eval()): training normalises with the
batch's statistics over all T tokens (biased variance) and updates running
statistics (momentum 0.1, unbiased variance, eps 1e-5); eval and generation
normalise with the running statistics, so a token's routing then depends on
that token alone. In training the batch statistics mix in later tokens of the
same sequence: a (small, O(1/T)) non-causal leak the paper has as well.

Registered as router 'product_key' with its own projection (RouterSpec.
projection): two kernels W_x, W_y [d, n], and `route` receives z = [z_x, z_y]
[T, 2n]. It never forms [T, N] (its point), so it gives no probs (no loss
applies; OmniMoE has none) and metrics over all N come from the counts.
OmniMoE is the one MoE layer with router=product_key, experts=atomic and one
shared expert (configs/lm_shakespeare_omnimoe.py). Settings: model.moe.
product_key.per_axis_k. Micro-batching is refused: BatchNorm normalises by the
tokens of each call, so M micro-batches are a different function.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError
from moejax.routing.base import (
  RouterConfig,
  RouterOutput,
  RouterProjection,
  Routing,
  register_router,
  routing_entropy,
)

BN_MOMENTUM = 0.1  # torch.nn.BatchNorm1d defaults, as in the official module
BN_EPS = 1e-5
SETTINGS = {"per_axis_k": 0}  # product-key candidates per axis; 0: min(top_k, n), exact


def grid_size(num_experts: int) -> int:
  """n with n * n = N, or ConfigError naming model.moe.num_experts."""
  n = math.isqrt(max(num_experts, 0))
  if num_experts < 1 or n * n != num_experts:
    raise ConfigError(
      f"model.moe.num_experts={num_experts} must be a positive perfect "
      "square with model.moe.router='product_key' (N = n x n grid)"
    )
  return n


def per_axis_k_of(cfg: RouterConfig) -> int:
  """model.moe.product_key.per_axis_k, 0 meaning min(top_k, n) (the smallest exact choice)."""
  return cfg.settings["per_axis_k"] or min(cfg.top_k, grid_size(cfg.num_experts))


def validate_product_key(cfg: RouterConfig) -> None:
  """The grid, top_k and per_axis_k (ConfigError naming key and value)."""
  n = grid_size(cfg.num_experts)
  per_axis_k = cfg.settings["per_axis_k"]
  if not 0 <= per_axis_k <= n:
    raise ConfigError(
      f"model.moe.product_key.per_axis_k={per_axis_k} must be in [0, n={n}] (0: min(top_k, n))"
    )
  a = per_axis_k_of(cfg)
  if cfg.top_k > a * a:  # (ranks (r, c) with (r+1)(c+1) <= top_k are then all a^2 pairs)
    raise ConfigError(
      f"model.moe.top_k={cfg.top_k} is larger than the per_axis_k^2="
      f"{a * a} candidate pairs (model.moe.product_key.per_axis_k={a})"
    )
  if a < min(cfg.top_k, n):
    raise ConfigError(
      f"model.moe.product_key.per_axis_k={a} < min(top_k={cfg.top_k}, n={n}):"
      " the product-key search would not be exact"
    )


def batch_norm(z, mean, var, *, train: bool):
  """BatchNorm1d(affine=False) over the token axis of z [T, n], float32.

  Returns (normalised z, new running mean, new running var); at eval the
  running statistics are used and returned unchanged.
  """
  if train:
    mu = jnp.mean(z, axis=0)
    v = jnp.mean(jnp.square(z - mu), axis=0)
    t = z.shape[0]
    unbiased = v * (t / max(t - 1, 1))
    mean = (1 - BN_MOMENTUM) * mean + BN_MOMENTUM * jax.lax.stop_gradient(mu)
    var = (1 - BN_MOMENTUM) * var + BN_MOMENTUM * jax.lax.stop_gradient(unbiased)
    return (z - mu) * jax.lax.rsqrt(v + BN_EPS), mean, var
  return (z - mean) * jax.lax.rsqrt(var + BN_EPS), mean, var


def candidate_ranks(top_k: int, per_axis_k: int) -> tuple[np.ndarray, np.ndarray]:
  """Static (row rank, column rank) pairs that can be in the top_k (see module doc)."""
  r, c = np.meshgrid(np.arange(per_axis_k), np.arange(per_axis_k), indexing="ij")
  keep = (r + 1) * (c + 1) <= top_k
  return r[keep], c[keep]


def product_key_top_k(lp_x, lp_y, top_k: int, per_axis_k: int):
  """Top_k pairs of score(i, j) = lp_x[t, i] + lp_y[t, j] by product-key search.

  lp_x, lp_y: [T, n]. Returns (scores [T, top_k] float, flat indices
  i * n + j [T, top_k] int32), best first; exact for per_axis_k >= min(top_k, n).
  """
  n = lp_x.shape[1]
  sx, ix = jax.lax.top_k(lp_x, per_axis_k)  # [T, a], best first
  sy, iy = jax.lax.top_k(lp_y, per_axis_k)
  r, c = candidate_ranks(top_k, per_axis_k)
  cand_score = sx[:, r] + sy[:, c]  # [T, C], C ~ top_k ln top_k
  cand_index = ix[:, r] * n + iy[:, c]
  score, pos = jax.lax.top_k(cand_score, top_k)
  return score, jnp.take_along_axis(cand_index, pos, axis=1).astype(jnp.int32)


def route_product_key(z_x, z_y, stats: dict, *, top_k: int, per_axis_k: int, train: bool):
  """The whole router on float32 logits z_x, z_y [T, n].

  stats: {'mean_x', 'var_x', 'mean_y', 'var_y'} running statistics [n].
  Returns (Routing with S = top_k valid slots over N = n^2 experts and
  weights exp(score), metrics, new stats). routing_entropy is the entropy of
  the full product distribution over N: H(p_x p_y) = H(p_x) + H(p_y).
  """
  nx, mean_x, var_x = batch_norm(z_x, stats["mean_x"], stats["var_x"], train=train)
  ny, mean_y, var_y = batch_norm(z_y, stats["mean_y"], stats["var_y"], train=train)
  lp_x, lp_y = jax.nn.log_softmax(nx, axis=-1), jax.nn.log_softmax(ny, axis=-1)
  score, index = product_key_top_k(lp_x, lp_y, top_k, per_axis_k)
  weight = jnp.exp(score)
  routing = Routing(index, weight, jnp.ones(index.shape, bool))
  metrics = {
    "routing_entropy": routing_entropy(jnp.exp(lp_x)) + routing_entropy(jnp.exp(lp_y)),
    "routed_weight_sum": jnp.mean(jnp.sum(weight, axis=-1)),
  }
  new_stats = {"mean_x": mean_x, "var_x": var_x, "mean_y": mean_y, "var_y": var_y}
  return routing, metrics, new_stats


def init_projection(key, d_model: int, num_experts: int, cfg: RouterConfig) -> dict:
  """W_x, W_y [d, n]: the dense fan-in init (BatchNorm makes the router scale-invariant)."""
  del cfg
  n = grid_size(num_experts)
  init = jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
  key_x, key_y = jax.random.split(key)
  return {
    "w_x": init(key_x, (d_model, n), jnp.float32),
    "w_y": init(key_y, (d_model, n), jnp.float32),
  }


def project(params, x, cfg: RouterConfig):
  """z = [x W_x, x W_y] [T, 2n]."""
  del cfg
  return jnp.concatenate([x @ params["w_x"], x @ params["w_y"]], axis=-1)


def init_batch_norm_state(num_experts: int) -> dict:
  n = grid_size(num_experts)
  return {
    "mean_x": jnp.zeros((n,), jnp.float32),
    "var_x": jnp.ones((n,), jnp.float32),
    "mean_y": jnp.zeros((n,), jnp.float32),
    "var_y": jnp.ones((n,), jnp.float32),
  }


@register_router(
  "product_key",
  init_state=init_batch_norm_state,
  validate=validate_product_key,
  settings=SETTINGS,
  gives_probs=False,
  projection=RouterProjection(
    init_projection, {"w_x": ("embed", None), "w_y": ("embed", None)}, project
  ),
  accumulation_check=lambda cfg: (
    "its BatchNorm normalises by the tokens of each call, so micro-batches route differently"
  ),
)
def product_key_router(z, *, cfg: RouterConfig, state, rng=None, train=False) -> RouterOutput:
  """OmniMoE's router on z = [z_x, z_y] (the module doc); BatchNorm statistics as state."""
  del rng
  n = z.shape[-1] // 2
  stats = {name: state[name] for name in ("mean_x", "var_x", "mean_y", "var_y")}
  routing, metrics, new_stats = route_product_key(
    z[:, :n], z[:, n:], stats, top_k=cfg.top_k, per_axis_k=per_axis_k_of(cfg), train=train
  )
  return RouterOutput(routing, None, None, metrics, new_stats)
