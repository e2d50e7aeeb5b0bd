"""Group-limited sigmoid routing of DeepSeek-V3 (DeepSeek-AI 2024, sec. 2.1.2; "node-limited
routing"), with the auxiliary-loss-free bias of `sigmoid_bias.py`.

    s = sigmoid(logits)                     scores, float32 [T, E]
    c = s + b                               b: e_score_correction_bias, non-trained state
    E experts form G equal groups; a group's score is the sum of its two highest c.
    Each token keeps its `topk_groups` best groups and picks its top_k experts
    by c among them only.
    weight = s of the picked experts, divided by their sum when `renormalize`
    (HF `norm_topk_prob`), times `routed_scaling_factor`.

With num_groups = topk_groups = 1 this is `sigmoid_bias` routing (optionally
without renormalisation). The bias follows sigmoid_bias's sign rule while
training (`bias_update_rate`; 0 keeps a loaded checkpoint's bias fixed), with its
state-update protocol (expert counts summed over micro-batches, one update per step).
Config keys (model.moe.routing, read through RouterConfig): num_groups (G),
topk_groups, renormalize, routed_scaling_factor, bias_update_rate.
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
from moejax.routing.sigmoid_bias import (
  init_bias_state,
  load_stats,
  update_bias_state,
  validate_bias_router,
)


def validate_group_limited(cfg: RouterConfig) -> None:
  validate_bias_router(cfg)
  groups, keep = cfg.num_groups, cfg.topk_groups
  if groups < 1 or cfg.num_experts % groups:
    raise ConfigError(
      f"model.moe.routing.num_groups={groups} must be >= 1 and divide "
      f"model.moe.num_experts={cfg.num_experts}"
    )
  if not 1 <= keep <= groups:
    raise ConfigError(f"model.moe.routing.topk_groups={keep} must be in [1, num_groups={groups}]")
  group_size = cfg.num_experts // groups
  if groups > 1 and group_size < 2:
    raise ConfigError(
      f"group-limited routing scores a group by its top 2 experts: "
      f"num_experts={cfg.num_experts} / num_groups={groups} must be >= 2"
    )
  if cfg.top_k > keep * group_size:
    raise ConfigError(
      f"model.moe.top_k={cfg.top_k} exceeds the {keep * group_size} experts "
      f"of topk_groups={keep} groups of {group_size}"
    )


def group_limited_choice(
  choice_scores: jax.Array, num_groups: int, topk_groups: int, k: int
) -> jax.Array:
  """Expert indices int32 [T, k]: top-k of `choice_scores` [T, E] within each token's
  `topk_groups` best groups (group score = sum of its top-2 choice scores)."""
  if num_groups == 1:
    return top_k_slots(choice_scores, k)[1]
  t, e = choice_scores.shape
  grouped = choice_scores.reshape(t, num_groups, e // num_groups)
  group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [T, G]
  _, kept = jax.lax.top_k(group_score, topk_groups)
  keep_group = jnp.any(jax.nn.one_hot(kept, num_groups, dtype=bool), axis=1)  # [T, G]
  masked = jnp.where(keep_group[:, :, None], grouped, -jnp.inf).reshape(t, e)
  return top_k_slots(masked, k)[1]


@register_router(
  "group_limited",
  init_state=init_bias_state,
  validate=validate_group_limited,
  update_state=update_bias_state,
)
def route_group_limited(
  logits: jax.Array,
  *,
  cfg: RouterConfig,
  state: Mapping[str, jax.Array],
  rng: jax.Array | None,
  train: bool,
) -> RouterOutput:
  del rng
  num_groups, topk_groups = cfg.num_groups, cfg.topk_groups
  scores = jax.nn.sigmoid(logits.astype(jnp.float32))
  bias = jax.lax.stop_gradient(state["bias"])
  index = group_limited_choice(scores + bias, num_groups, topk_groups, cfg.top_k)
  weight = jnp.take_along_axis(scores, index, axis=-1)
  if cfg.renormalize:
    weight = weight / (jnp.sum(weight, axis=-1, keepdims=True) + 1e-20)
  weight = weight * cfg.routed_scaling_factor
  routing = Routing(index, weight, jnp.ones(index.shape, bool))
  new_state, stats = {"bias": bias}, {}
  if train:
    stats = load_stats(routing, logits.shape[-1])
    new_state = update_bias_state(state, stats, cfg)
  probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
  metrics = {
    "routing_entropy": routing_entropy(probs),
    "bias_norm": jnp.linalg.norm(new_state["bias"]),
  }
  return RouterOutput(routing, logits, probs, metrics, new_state, stats)
