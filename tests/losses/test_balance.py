"""Switch load-balance loss and router z-loss against closed forms at top-1, 2 and 4,
with dropped (invalid) slots: f_e is the share of *valid assignments* (all k
slots counted), not of tokens, and invalid slots count nowhere."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.losses import get_loss
from moejax.losses.balance import load_balance_loss, router_z_loss
from moejax.routing import Routing, RouterOutput


def output(index, valid, probs, logits=None):
  index, valid = np.asarray(index, np.int32), np.asarray(valid, bool)
  probs = jnp.asarray(probs, jnp.float32)
  routing = Routing(jnp.asarray(index), jnp.where(jnp.asarray(valid), 0.5, 0.0), jnp.asarray(valid))
  logits = jnp.log(probs) if logits is None else jnp.asarray(logits, jnp.float32)
  return RouterOutput(routing, logits, probs, {}, {})


def brute_force(index, valid, probs):
  """E * sum_e f_e P_e, counting one assignment at a time in float64."""
  index, valid, probs = np.asarray(index), np.asarray(valid), np.asarray(probs, np.float64)
  num_experts = probs.shape[1]
  counts = np.zeros(num_experts)
  for t in range(index.shape[0]):
    for s in range(index.shape[1]):
      if valid[t, s]:
        counts[index[t, s]] += 1
  f = counts / max(counts.sum(), 1)
  return num_experts * float(np.sum(f * probs.mean(0)))


PROBS_4x4 = np.array(
  [[0.4, 0.3, 0.2, 0.1], [0.1, 0.5, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]]
)  # column means P = [0.3625, 0.2875, 0.2125, 0.1375]


def test_top2_closed_form_with_a_dropped_slot():
  # token 0 -> {0, 1}, token 1 -> {1, 2}, token 2 -> {2, (3 dropped)}, token 3 -> {0, 3}:
  # 7 valid assignments, counts [2, 2, 2, 1], f = counts / 7 (not / 4 tokens).
  index = [[0, 1], [1, 2], [2, 3], [0, 3]]
  valid = [[1, 1], [1, 1], [1, 0], [1, 1]]
  expected = 4 * (2 * 0.3625 + 2 * 0.2875 + 2 * 0.2125 + 1 * 0.1375) / 7
  np.testing.assert_allclose(expected, 7.45 / 7, rtol=1e-12)  # the arithmetic
  np.testing.assert_allclose(
    load_balance_loss(output(index, valid, PROBS_4x4)), expected, rtol=1e-6
  )


def test_top4_closed_form_with_dropped_slots():
  # Every token lists all 4 experts; drops leave counts [4, 3, 2, 1] of 10 valid.
  index = [[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2], [2, 3, 0, 1]]
  valid = [[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 1, 0]]
  expected = 4 * (4 * 0.3625 + 3 * 0.2875 + 2 * 0.2125 + 1 * 0.1375) / 10
  np.testing.assert_allclose(expected, 1.15, rtol=1e-12)
  np.testing.assert_allclose(
    load_balance_loss(output(index, valid, PROBS_4x4)), expected, rtol=1e-6
  )


@pytest.mark.parametrize("k", [2, 4])
def test_perfect_balance_at_top_k_gives_exactly_one(k):
  # T = 8 tokens over E = 8 experts, each token takes k consecutive experts: every
  # expert gets k of the 8k assignments; uniform probabilities. f_e = 1/8, loss 1
  # (dividing by tokens instead of assignments would give k).
  index = (np.arange(8)[:, None] + np.arange(k)[None]) % 8
  probs = np.full((8, 8), 1 / 8)
  np.testing.assert_allclose(
    load_balance_loss(output(index, np.ones((8, k)), probs)), 1.0, rtol=1e-6
  )


@pytest.mark.parametrize("seed,t,e,k", [(0, 13, 6, 2), (1, 9, 8, 4), (2, 20, 5, 1), (3, 7, 4, 3)])
def test_random_routings_with_drops_equal_brute_force(seed, t, e, k):
  rng = np.random.default_rng(seed)
  index = np.stack([rng.permutation(e)[:k] for _ in range(t)])
  valid = rng.random((t, k)) < 0.7
  valid[0] = True  # at least one valid slot
  probs = rng.dirichlet(np.ones(e), size=t)
  out = output(index, valid, probs)
  np.testing.assert_allclose(load_balance_loss(out), brute_force(index, valid, probs), rtol=1e-6)
  np.testing.assert_allclose(
    get_loss("load_balance")(out), brute_force(index, valid, probs), rtol=1e-6
  )


def test_invalid_slots_expert_index_is_ignored():
  # The same routing with garbage experts in the dropped slots gives the same loss.
  index = np.array([[0, 1], [1, 2], [2, 3], [0, 3]])
  valid = np.array([[1, 1], [1, 1], [1, 0], [0, 1]], bool)
  other = np.where(valid, index, 0)
  a = load_balance_loss(output(index, valid, PROBS_4x4))
  b = load_balance_loss(output(other, valid, PROBS_4x4))
  np.testing.assert_array_equal(a, b)


def test_no_valid_assignment_gives_zero_not_nan():
  out = output(np.zeros((4, 2)), np.zeros((4, 2)), PROBS_4x4)
  assert float(load_balance_loss(out)) == 0.0


def test_gradient_flows_through_probs_only():
  # d loss / d probs[t, e] = E * f_e / T (f is a constant of the routing).
  index = [[0, 1], [1, 2], [2, 3], [0, 3]]
  valid = [[1, 1], [1, 1], [1, 0], [1, 1]]
  out = output(index, valid, PROBS_4x4)
  grad = jax.grad(lambda p: load_balance_loss(out.replace(probs=p)))(out.probs)
  f = np.array([2, 2, 2, 1]) / 7
  np.testing.assert_allclose(grad, np.tile(4 * f / 4, (4, 1)), rtol=1e-6)


def test_z_loss_closed_form_over_several_tokens():
  logits = np.array([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]])
  lse = np.log(np.exp(logits).sum(1))
  out = output(np.zeros((3, 1)), np.ones((3, 1)), np.full((3, 3), 1 / 3), logits)
  np.testing.assert_allclose(router_z_loss(out), np.mean(lse**2), rtol=1e-6)
  np.testing.assert_allclose(get_loss("z_loss")(out), np.mean(lse**2), rtol=1e-6)
  # d/dlogits = 2 lse_t softmax(logits_t) / T
  grad = jax.grad(lambda z: router_z_loss(out.replace(logits=z)))(out.logits)
  softmax = np.exp(logits - lse[:, None])
  np.testing.assert_allclose(grad, 2 * lse[:, None] * softmax / 3, rtol=1e-5)


def test_a_single_valid_assignment():
  # One valid slot (token 2 -> expert 1): f is one-hot, loss = E * P_1 = 4 * 0.2875.
  valid = np.zeros((4, 2), bool)
  valid[2, 0] = True
  index = np.array([[0, 1], [1, 2], [1, 3], [0, 3]])
  np.testing.assert_allclose(
    load_balance_loss(output(index, valid, PROBS_4x4)), 4 * 0.2875, rtol=1e-6
  )
