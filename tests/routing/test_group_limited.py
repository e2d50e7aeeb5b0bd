"""Group-limited routing (DeepSeek-V3) against a per-token brute force, and its
reduction to sigmoid_bias routing with one group."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.routing import call_router, get_router, router_config
from tests.helpers import moe_cfg, random_logits


def brute_force(logits, bias, groups, keep, k):
  """For each token: among all choices of `keep` groups, the best-scoring groups
  (group score = sum of its top-2 biased scores), then its top-k experts."""
  scores = 1 / (1 + np.exp(-logits.astype(np.float64)))
  choice = scores + bias
  size = logits.shape[1] // groups
  out = []
  for row in choice:
    group_score = [np.sort(row[g * size : (g + 1) * size])[-2:].sum() for g in range(groups)]
    best = max(
      itertools.combinations(range(groups), keep), key=lambda gs: sum(group_score[g] for g in gs)
    )
    allowed = [e for g in best for e in range(g * size, (g + 1) * size)]
    out.append(sorted(sorted(allowed, key=lambda e: -row[e])[:k]))
  return np.array(out), scores


@pytest.mark.parametrize("groups,keep,k", [(4, 2, 3), (8, 3, 2), (2, 1, 4)])
def test_matches_brute_force(groups, keep, k):
  logits = random_logits(0, 24, 16)
  bias = np.random.default_rng(1).normal(0, 0.3, 16).astype(np.float32)
  cfg = moe_cfg(
    router="group_limited",
    num_experts=16,
    top_k=k,
    routing={"num_groups": groups, "topk_groups": keep, "routed_scaling_factor": 2.5},
  )
  get_router("group_limited").validate(router_config("group_limited", cfg))
  out = call_router("group_limited", jnp.asarray(logits), cfg, state={"bias": jnp.asarray(bias)})
  want, scores = brute_force(logits, bias, groups, keep, k)
  index = np.asarray(out.routing.expert_index)
  np.testing.assert_array_equal(np.sort(index, -1), want)
  weight = np.take_along_axis(scores, index, -1)
  np.testing.assert_allclose(
    np.asarray(out.routing.combine_weight), 2.5 * weight / weight.sum(-1, keepdims=True), rtol=1e-5
  )


def test_one_group_is_sigmoid_bias_routing():
  logits = jnp.asarray(random_logits(2, 32, 8))
  state = {"bias": jnp.linspace(-0.2, 0.2, 8)}
  cfg = moe_cfg(router="group_limited", top_k=2, routing={"routed_scaling_factor": 1.5})
  ours = call_router("group_limited", logits, cfg, state=state)
  ref = call_router("sigmoid_bias", logits, cfg, state=state)
  np.testing.assert_array_equal(ours.routing.expert_index, ref.routing.expert_index)
  np.testing.assert_allclose(ours.routing.combine_weight, ref.routing.combine_weight, rtol=1e-6)


@pytest.mark.parametrize(
  "overrides,message",
  [
    (dict(num_groups=3), r"model\.moe\.routing\.num_groups=3 must be >= 1 and divide"),
    (dict(num_groups=4, topk_groups=5), r"topk_groups=5 must be in \[1, num_groups=4\]"),
    (dict(num_groups=4, topk_groups=1, top_k=3), "exceeds the 2 experts"),
    (dict(num_groups=8), "top 2 experts"),
  ],
)
def test_bad_group_settings_are_refused(overrides, message):
  routing = {k: v for k, v in overrides.items() if k != "top_k"}
  with pytest.raises(ConfigError, match=message):
    cfg = moe_cfg(router="group_limited", top_k=overrides.get("top_k", 2), routing=routing)
    get_router("group_limited").validate(router_config("group_limited", cfg))
