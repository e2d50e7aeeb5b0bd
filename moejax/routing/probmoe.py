"""ProbMoE: exact-k routing as a conditional Bernoulli distribution (arXiv 2606.01509).

Read from the official code (HengHugoZhao/ProbMoE, `ProbMoE_V1_qwen_exact.py`
and `..._dynamic.py`); this is an independent JAX implementation.

Model. Each expert j has an independent Bernoulli z_j with p_j = sigmoid(l_j),
q_j = 1 - p_j, and the routing subset is z conditioned on sum_j z_j = k:
    P(z | sum z = k) = prod_j p_j^z_j q_j^(1 - z_j) / Z_k,
    Z_k = sum_{|S| = k} prod_{j in S} p_j prod_{j not in S} q_j.
The partition function comes from a log-space dynamic programme over experts:
    A[0, 0] = 0,  A[0, j > 0] = -inf,
    A[i, j] = logaddexp(A[i-1, j-1] + log p_i, A[i-1, j] + log q_i),
    log Z_k = A[n, k].
Marginals m_j = P(z_j = 1 | sum z = k) = d log Z_k / d log p_j, taken by
autodiff at fixed log q (the partial derivative is the marginal whatever log q
does in the outer derivative). log p = log_sigmoid(l) and log q =
log_sigmoid(-l) are each computed directly, so both stay exact for any |l| in
float32.

The gradient of the marginals (they enter the straight-through weights below)
comes in the two forms the official repository ships, chosen by
`model.moe.probmoe.detach_log_q`:
  True (default): log q is a stop-gradient, as in the Qwen scripts
    (`ProbMoE_V1_qwen_{exact,dynamic}.py`: `log_q = log1mexp(log_p.detach())`).
    Then dm_i/dl_j = Cov(z_i, z_j | sum z = k) * q_j.
  False: log q stays connected to the logits, as in the OLMoE training scripts
    (`train/olmoe/open_instruct/OLMoE/v1/ProbMoE_V1_olmoe_{exact,dynamic}.py`
    at HEAD: `log_q = log1mexp(log_p)` and the marginal taken at a zero probe
    added to log p). Then dm_i/dl_j = Cov(z_i, z_j | sum z = k), the exponential
    family identity for the natural parameter l_j = log p_j - log q_j.
So the two differ by a factor q_j per expert (column j of the Jacobian): Z_k
is homogeneous of degree one in (p_j, q_j), so m depends on log p - log q only
and d m / d log q_j = -d m / d log p_j.
Exact sampling walks the table backwards (i = n..1, j = remaining count):
    P(z_i = 1 | j left) = exp(A[i-1, j-1] + log p_i - A[i, j]).
Training weights use the straight-through estimator
    g = stop_gradient(z - m) + m,   w = g * softmax(l),
gathered at the sampled experts, not renormalised (forward value z * softmax).
Evaluation (train=False) is deterministic: softmax top-k, renormalised when
`model.moe.routing.renormalize` (the official `norm_topk_prob`).

Dynamic-k ("band" mode, `probmoe.k_min`/`probmoe.k_max` both > 0): the DP runs
to k_max; k is drawn from P(sum z = k) restricted to [k_min, k_max]
(softmax of A[n, k_min..k_max]), then a subset of that size is drawn exactly.
Marginals are those of the band-conditioned distribution, d/dlog p of
logsumexp_k A[n, k]. Routing uses S = k_max slots, slots past the sampled k
invalid. At evaluation k* = argmax over k in the band of the prefix sum of the
logits sorted in decreasing order (as the official code does: in effect keep
experts with positive logits, clipped to the band); the top-k* softmax weights,
renormalised when `renormalize`.

Differences from the official code: the official `log_sigmoid` clamps log p
at -1e-7 and derives log q = log1mexp(log p) from the clamped value, so every
logit above ~16 gets the same p and marginals go wrong (logits [20, 19, 18, 17,
16, -1, -2, 0, 1, 2], k = 4: 0.805 x 4, 0.78 instead of 0.988, 0.968, 0.914,
0.766, 0.364); moejax uses log_sigmoid(+-l) unclamped. The optional "gradient
clipping" of the marginals (0.99 m + 0.01 sigmoid, clamped to [1e-3, 1 - 1e-3])
is not implemented; -inf is a finite -1e30 rather than -300 (so very negative
logits cannot fall below the sentinel); everything is float32.
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError
from moejax.routing.base import (
  RouterConfig,
  RouterOutput,
  Routing,
  register_router,
  routing_entropy,
  top_k_slots,
)
from moejax.routing.topk import softmax_top_k, validate_top_k

NEG = -1e30  # log(0) stand-in that stays finite under addition


def bernoulli_log_probs(
  logits: jax.Array, detach_log_q: bool = True
) -> tuple[jax.Array, jax.Array]:
  """(log p, log q) = (log_sigmoid(l), log_sigmoid(-l)), float32, exact for any |l|.

  detach_log_q=True stops the gradient through log q (the official Qwen scripts);
  False keeps it (the official OLMoE scripts); see the module docstring.
  """
  logits = logits.astype(jnp.float32)
  log_p = jax.nn.log_sigmoid(logits)
  log_q = jax.nn.log_sigmoid(-logits)
  if detach_log_q:
    log_q = jax.lax.stop_gradient(log_q)
  return log_p, log_q


def count_table(log_p: jax.Array, log_q: jax.Array, k_max: int) -> jax.Array:
  """The DP table A [n+1, T, k_max+1]: A[i, t, j] = log P(j of the first i experts on).

  log_p, log_q: [T, n]. A[i, t, j] is the log-probability (unconditioned) that
  exactly j of experts 0..i-1 are selected.
  """
  num_tokens = log_p.shape[0]
  a0 = jnp.full((num_tokens, k_max + 1), NEG, jnp.float32).at[:, 0].set(0.0)

  def step(a, lp_lq):
    lp, lq = lp_lq  # [T]
    take = jnp.concatenate(
      [jnp.full((num_tokens, 1), NEG, jnp.float32), a[:, :-1] + lp[:, None]], axis=1
    )
    new = jnp.logaddexp(take, a + lq[:, None])
    return new, new

  _, rows = jax.lax.scan(step, a0, (log_p.T, log_q.T))
  return jnp.concatenate([a0[None], rows], axis=0)


def log_partition(log_p, log_q, k_min: int, k_max: int) -> jax.Array:
  """log P(k_min <= sum z <= k_max) per token, [T]."""
  table = count_table(log_p, log_q, k_max)
  return jax.nn.logsumexp(table[-1, :, k_min : k_max + 1], axis=-1)


def marginals_and_table(log_p, log_q, k_min: int, k_max: int):
  """(P(z_j = 1 | k_min <= sum z <= k_max) [T, n], differentiable in log p; DP table)."""

  def total_log_z(lp):
    table = count_table(lp, log_q, k_max)
    return jnp.sum(jax.nn.logsumexp(table[-1, :, k_min : k_max + 1], axis=-1)), table

  return jax.grad(total_log_z, has_aux=True)(log_p)


def marginals(log_p, log_q, k_min: int, k_max: int) -> jax.Array:
  """P(z_j = 1 | k_min <= sum z <= k_max), [T, n], differentiable in log p."""
  return marginals_and_table(log_p, log_q, k_min, k_max)[0]


def sample_subsets(rng, table: jax.Array, log_p: jax.Array, ks: jax.Array) -> jax.Array:
  """Exact samples z [T, n] (float 0/1) with sum_j z[t, j] = ks[t], by backward sampling."""
  n = log_p.shape[1]
  uniforms = jax.random.uniform(rng, (n,) + ks.shape, jnp.float32)

  def step(j, inputs):
    i, u = inputs  # expert i (0-based) decided now; table row i holds the first i experts
    prev = table[i]  # [T, k_max+1]
    here = table[i + 1]
    jm1 = jnp.maximum(j - 1, 0)
    take = (
      jnp.take_along_axis(prev, jm1[:, None], 1)[:, 0]
      + log_p[:, i]
      - jnp.take_along_axis(here, j[:, None], 1)[:, 0]
    )
    prob = jnp.where(j > 0, jnp.exp(jnp.minimum(take, 0.0)), 0.0)
    z = (u < prob).astype(jnp.int32)
    return j - z, z

  _, zs = jax.lax.scan(
    step,
    ks.astype(jnp.int32),
    (jnp.arange(n - 1, -1, -1), uniforms),
  )
  return zs[::-1].T.astype(jnp.float32)


def sample_band_k(rng, table: jax.Array, k_min: int, k_max: int) -> jax.Array:
  """k ~ P(sum z = k | k_min <= sum z <= k_max) per token, int32 [T]."""
  logits = table[-1, :, k_min : k_max + 1]
  return (jax.random.categorical(rng, logits, axis=-1) + k_min).astype(jnp.int32)


def band(cfg: RouterConfig) -> tuple[int, int, bool]:
  """(k_min, k_max, dynamic) from the config: exact-k uses top_k."""
  s = cfg.settings
  if s["k_min"] > 0 or s["k_max"] > 0:
    return s["k_min"], s["k_max"], True
  return cfg.top_k, cfg.top_k, False


def probmoe_train(logits, rng, k_min: int, k_max: int, detach_log_q: bool = True):
  """Stochastic training routing: (Routing with S = k_max slots, marginals)."""
  log_p, log_q = bernoulli_log_probs(logits, detach_log_q)
  m, table = marginals_and_table(log_p, log_q, k_min, k_max)
  table = jax.lax.stop_gradient(table)
  k_rng, z_rng = jax.random.split(rng)
  if k_min == k_max:
    ks = jnp.full(logits.shape[:1], k_max, jnp.int32)
  else:
    ks = sample_band_k(k_rng, table, k_min, k_max)
  z = sample_subsets(z_rng, table, jax.lax.stop_gradient(log_p), ks)
  g = jax.lax.stop_gradient(z - m) + m
  w_full = g * jax.nn.softmax(logits, axis=-1)
  chosen, index = top_k_slots(z, k_max)  # the ones first, then zeros
  valid = chosen > 0.5
  weight = jnp.where(valid, jnp.take_along_axis(w_full, index, 1), 0.0)
  index = jnp.where(valid, index, 0)
  return Routing(index, weight, valid), m


def dynamic_eval(logits, k_min: int, k_max: int, renormalize: bool) -> Routing:
  """k* = argmax_{k in band} sum of the k largest logits; top-k* softmax weights."""
  probs = jax.nn.softmax(logits, axis=-1)
  sorted_logits, index = top_k_slots(logits, k_max)
  prefix = jnp.cumsum(sorted_logits, axis=-1)[:, k_min - 1 :]
  k_star = jnp.argmax(prefix, axis=-1) + k_min
  valid = jnp.arange(k_max)[None, :] < k_star[:, None]
  weight = jnp.where(valid, jnp.take_along_axis(probs, index, 1), 0.0)
  if renormalize:
    weight = weight / jnp.sum(weight, axis=-1, keepdims=True)
  return Routing(jnp.where(valid, index, 0), weight, valid)


# model.moe.probmoe: k_min = k_max = 0 is exact-k (k = top_k), both > 0 the
# dynamic-k band; detach_log_q: stop-gradient on log q (official Qwen scripts;
# False: OLMoE). Configs saved before the section had flat probmoe_* keys.
SETTINGS = {"k_min": 0, "k_max": 0, "detach_log_q": True}
LEGACY_KEYS = {
  "probmoe_k_min": "k_min",
  "probmoe_k_max": "k_max",
  "probmoe_detach_log_q": "detach_log_q",
}


def validate_keys(cfg: RouterConfig) -> None:
  """Checks model.moe.probmoe (k_min, k_max: 0, 0 = exact-k; detach_log_q) whatever
  the router."""
  s = cfg.settings
  if not isinstance(s["detach_log_q"], bool):
    raise ConfigError(f"model.moe.probmoe.detach_log_q={s['detach_log_q']!r} must be True or False")
  lo, hi = s["k_min"], s["k_max"]
  if lo == 0 and hi == 0:
    return
  if lo < 1:
    raise ConfigError(
      f"model.moe.probmoe.k_min={lo} must be >= 1 when "
      "dynamic-k is on (or both probmoe.k_min and probmoe.k_max 0)"
    )
  if hi < lo:
    raise ConfigError(f"model.moe.probmoe.k_min={lo} must be <= model.moe.probmoe.k_max={hi}")
  if hi > cfg.num_experts:
    raise ConfigError(
      f"model.moe.probmoe.k_max={hi} must be <= model.moe.num_experts={cfg.num_experts}"
    )


@register_router(
  "probmoe",
  validate=validate_top_k,
  promises={"weights_proportional_to_probs"},
  settings=SETTINGS,
  legacy_keys=LEGACY_KEYS,
  validate_settings=validate_keys,
)
def route_probmoe(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  k_min, k_max, dynamic = band(cfg)
  probs = jax.nn.softmax(logits, axis=-1)
  metrics = {"routing_entropy": routing_entropy(probs)}
  if train:
    if rng is None:
      raise ValueError("router 'probmoe' samples its routing in training: pass rng")
    routing, m = probmoe_train(logits, rng, k_min, k_max, cfg.settings["detach_log_q"])
    metrics["probmoe_marginal_max"] = jnp.mean(jnp.max(m, axis=-1))
  elif dynamic:
    routing = dynamic_eval(logits, k_min, k_max, cfg.renormalize)
  else:
    routing, _ = softmax_top_k(logits, k_max, cfg.renormalize)
  metrics["active_experts"] = jnp.mean(jnp.sum(routing.valid, axis=-1).astype(jnp.float32))
  return RouterOutput(routing, logits, probs, metrics, state)
