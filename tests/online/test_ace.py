"""ACE (moejax/online/ace.py): the oracle's regret is exactly 0; the indices equal
their formulas by hand and pick what a hand count says; a plain-python brute
force replays the dense (lax.scan, vmap) and the pruned (numpy) simulators on
the same rewards; the pruned simulator's own sampling has the dense one's law;
a row's regret does not depend on the other rows of its batch; refusals name the
value."""

import math

import jax
import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.online import ace

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


def brute_force(means, table, policy, c, horizon):
  """Choices of one seed by plain loops: every expert's sum, every round."""
  sums, choices = [0.0] * horizon, []
  for t in range(horizon):
    best, pick = None, None
    for i in range(t + 1):
      n = t - i
      if policy == "oracle":
        value = float(means[i])
      elif n == 0:
        value = math.inf if policy == "ucb" else -math.inf
      else:
        sign = {"ucb": 1.0, "greedy": 0.0, "lcb": -1.0}[policy]
        value = sums[i] / n + sign * math.sqrt(c * math.log(horizon) / n)
      if best is None or value > best:  # strict: ties go to the oldest expert
        best, pick = value, i
    choices.append(pick)
    for i in range(t + 1):
      sums[i] += float(table[t][i])
  return choices


def test_regret_by_hand_and_the_oracle_is_exactly_zero():
  # Best so far: 0.2, 0.5, 0.5; picks 0, 0, 2: 0 + 0.3 + 0.4.
  assert ace.regret([[0.2, 0.5, 0.1]], [[0, 0, 2]])[0] == pytest.approx(0.7, abs=1e-15)
  key = jax.random.key(0)
  for means in (ace.stochastic_means(60, 3, seed=1), ace.adversarial_means(60, 3)):
    assert np.all(ace.simulate(means, "oracle", block=7)[1] == 0.0)
    assert np.all(ace.simulate_dense(key, means, "oracle")[1] == 0.0)
    assert np.all(ace.simulate_dense(key, means, "oracle", rewards="gaussian")[1] == 0.0)
  # Anything else on the staircase pays: lcb lags, ucb pays every decoy.
  means = ace.adversarial_means(200, 2)
  lcb, ucb = ace.simulate(means, "lcb")[1], ace.simulate(means, "ucb")[1]
  assert np.all(0 < lcb) and np.all(lcb < ucb)
  # ucb always takes the newcomer: regret = sum_t (best so far - mu_t), rewards aside.
  expected = (np.maximum.accumulate(means, axis=1) - means).sum(axis=1)
  np.testing.assert_allclose(ucb, expected, rtol=1e-12)


def test_indices_equal_their_formulas_and_pick_by_hand():
  # Round 3 of T=4: experts 0, 1, 2, 3 hold n = 3, 2, 1, 0 rewards summing to 2, 1, 1, 0.
  table = np.zeros((1, 4, 4), np.int64)
  table[0, 0, 0] = table[0, 2, 0] = 1  # expert 0: 1, 0, 1
  table[0, 2, 1] = 1  # expert 1: 0, 1
  table[0, 2, 2] = 1  # expert 2: 1
  total, count = np.array([2, 1, 1, 0]), np.array([3, 2, 1, 0])
  log4 = 1.3862943611198906
  lcb = [2 / 3 - math.sqrt(log4 / 3), 1 / 2 - math.sqrt(log4 / 2), 1 - math.sqrt(log4), -math.inf]
  ucb = [2 / 3 + math.sqrt(log4 / 3), 1 / 2 + math.sqrt(log4 / 2), 1 + math.sqrt(log4), math.inf]
  greedy = [2 / 3, 1 / 2, 1, -math.inf]
  for xp in (np, jax.numpy):  # jax in float32
    for policy, expected in (("lcb", lcb), ("ucb", ucb), ("greedy", greedy)):
      got = ace.index(policy, xp.asarray(total), xp.asarray(count), 0.5, 4, 1.0, xp=xp)
      np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-6)
  # lcb -0.013 > -0.177 > -0.333: expert 0; greedy: expert 2 (1.0); ucb: the newcomer.
  means = np.full((1, 4), 0.5)
  for policy, pick in (("lcb", 0), ("greedy", 2), ("ucb", 3)):
    assert ace.simulate(means, policy, table=table, block=2)[0][0, 3] == pick
  c2 = ace.index("lcb", np.array([3]), np.array([4]), 0.0, 100, c=2.0)[0]
  assert c2 == pytest.approx(0.75 - math.sqrt(2 * math.log(100) / 4), abs=1e-15)


@pytest.mark.parametrize("horizon", [1, 2, 37, 90])
def test_brute_force_replays_both_simulators(horizon):
  key = jax.random.key(horizon)
  with jax.enable_x64(True):
    for means in (
      ace.stochastic_means(horizon, 3, seed=2),
      ace.adversarial_means(horizon, 3),
      ace.stochastic_means(horizon, 3, seed=3, low=0.8, high=1.0),
    ):  # near ties
      table = np.asarray(ace.reward_matrix(key, means))
      for policy in ace.POLICIES:
        dense = ace.simulate_dense(key, means, policy)[0]
        brute = [brute_force(m, x, policy, 1.0, horizon) for m, x in zip(means, table)]
        np.testing.assert_array_equal(dense, brute, err_msg=policy)
        for block in (1, 3, 32):
          pruned = ace.simulate(means, policy, table=table, block=block)[0]
          np.testing.assert_array_equal(pruned, brute, err_msg=f"{policy} block={block}")
    # Gaussian rewards (dense only), with c = 0.3.
    means = ace.stochastic_means(horizon, 2, seed=4)
    table = np.asarray(ace.reward_matrix(key, means, rewards="gaussian", sigma=0.5))
    for policy in ("lcb", "greedy"):
      dense = ace.simulate_dense(key, means, policy, c=0.3, rewards="gaussian", sigma=0.5)[0]
      brute = [brute_force(m, x, policy, 0.3, horizon) for m, x in zip(means, table)]
      np.testing.assert_array_equal(dense, brute)


@pytest.mark.integration
@pytest.mark.parametrize("policy", ["lcb", "greedy"])
def test_pruned_sampling_has_the_dense_law(policy):
  # Its Binomial catch-ups and per-round draws against the dense model's draws:
  # mean regret over 400 seeds within 4 standard errors of the difference.
  horizon, seeds = 240, 400
  for means in (
    ace.stochastic_means(horizon, seeds, seed=5),
    ace.adversarial_means(horizon, seeds),
  ):
    pruned = ace.simulate(means, policy, seed=6, block=8)[1]
    dense = ace.simulate_dense(jax.random.key(7), means, policy)[1]
    se = math.sqrt(pruned.var() / seeds + dense.var() / seeds)
    assert abs(pruned.mean() - dense.mean()) < 4 * se + 1e-9, (pruned.mean(), dense.mean(), se)


def test_a_rows_regret_does_not_depend_on_its_batch():
  # Row r draws from its own stream (rows[r]): rows 4 and 1 alone replay the full batch.
  means = ace.instance("stochastic", 300, range(6), seed=2)
  np.testing.assert_array_equal(means[[4, 1]], ace.instance("stochastic", 300, [4, 1], seed=2))
  np.testing.assert_array_equal(
    ace.instance("adversarial", 300, [3, 0]), ace.adversarial_means(300, 2)
  )
  key = jax.random.key(3)
  for policy in ("lcb", "greedy"):
    whole = ace.simulate(means, policy, seed=1, block=16)
    part = ace.simulate(means[[4, 1]], policy, seed=1, block=16, rows=[4, 1])
    np.testing.assert_array_equal(part[0], whole[0][[4, 1]])
    dense = ace.simulate_dense(key, means, policy)[0]
    np.testing.assert_array_equal(
      ace.simulate_dense(key, means[[4, 1]], policy, rows=[4, 1])[0], dense[[4, 1]]
    )
  np.testing.assert_array_equal(
    ace.reward_matrix(key, means[[4]], rows=[4])[0], ace.reward_matrix(key, means)[4]
  )


@pytest.mark.parametrize(
  "call, named",
  [
    (lambda: ace.stochastic_means(0), "T=0"),
    (lambda: ace.adversarial_means(-3), "T=-3"),
    (lambda: ace.simulate(np.zeros((1, 0)), "lcb"), "shape=(1, 0)"),
    (lambda: ace.simulate(np.full((1, 5), 0.5), "lcb", c=-1.0), "c=-1.0"),
    (lambda: ace.simulate(np.full((1, 5), 0.5), "lcb", c=math.nan), "c=nan"),
    (lambda: ace.simulate(np.full((1, 5), 0.5), "lcb", block=0), "block=0"),
    (lambda: ace.simulate(np.full((1, 5), 0.5), "thompson"), "'thompson'"),
    (lambda: ace.simulate(np.full((1, 5), 1.5), "lcb"), "1.5"),
    (lambda: ace.simulate(np.full((1, 3), 0.5), "lcb", table=np.ones((1, 3, 2))), "(1, 3, 2)"),
    (
      lambda: ace.simulate_dense(
        jax.random.key(0), np.full((1, 5), 0.5), "lcb", rewards="gaussian", sigma=0.0
      ),
      "sigma=0.0",
    ),
    (
      lambda: ace.reward_matrix(jax.random.key(0), np.full((1, 5), 0.5), rewards="cauchy"),
      "'cauchy'",
    ),
    (lambda: ace.stochastic_means(10, 0), "seeds=0"),
    (lambda: ace.adversarial_means(10, decoy=2.0), "decoy=2.0"),
    (lambda: ace.regret([[0.1, 0.2]], [[1, 1]]), "choices=[1]"),
    (lambda: ace.simulate(np.full((2, 5), 0.5), "lcb", rows=[0]), "rows=[0]"),
    (lambda: ace.instance("bursty", 10, [0]), "'bursty'"),
    (lambda: ace.instance("stochastic", 10, [-1]), "draws=[-1]"),
  ],
)
def test_refusals_name_the_value(call, named):
  with pytest.raises(ConfigError) as error:
    call()
  assert named in str(error.value) and "\n" not in str(error.value)
