"""RSL (loss 'rsl', moejax/losses/rsl.py): its value on hand-worked cases, each weight
alone, and its minimum by brute force over a grid of routing distributions."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.assignment.routing import RouterOutput, Routing
from moejax.errors import ConfigError
from moejax.losses import LossConfig, get_loss
from moejax.losses.rsl import rsl_terms
from moejax.validation import validate_part_settings
from moejax.config import base_config
from moejax.registry import Settings

LOG2, LOG3 = math.log(2.0), math.log(3.0)


def output(probs, index):
  probs = jnp.asarray(probs, jnp.float32)
  index = jnp.asarray(index).astype(jnp.int32)
  routing = Routing(index, jnp.ones(index.shape), jnp.ones(index.shape, bool))
  return RouterOutput(routing, jnp.log(jnp.maximum(probs, 1e-30)), probs, {}, {})


def weights(balance, token, marginal):
  return LossConfig(
    Settings(
      {
        "balance_weight": balance,
        "token_entropy_weight": token,
        "marginal_entropy_weight": marginal,
      }
    )
  )


def test_hand_worked_case_and_each_weight():
  # tokens p = (1, 0) -> expert 0 and p = (1/2, 1/2) -> expert 1: f = (1/2, 1/2),
  # Pbar = (3/4, 1/4). balance 2 (3/8 + 1/8) = 1; mean token entropy log(2) / 2;
  # H(Pbar) = -(3/4) log(3/4) - (1/4) log(1/4) = 2 log 2 - (3/4) log 3.
  out = output([[1.0, 0.0], [0.5, 0.5]], [[0], [1]])
  terms = {k: float(v) for k, v in rsl_terms(out).items()}
  assert terms["balance"] == pytest.approx(1.0, abs=1e-6)
  assert terms["token_entropy"] == pytest.approx(LOG2 / 2, abs=1e-6)
  assert terms["marginal_entropy"] == pytest.approx(2 * LOG2 - 0.75 * LOG3, abs=1e-6)
  rsl = get_loss("rsl")
  assert float(rsl(out, weights(1.0, 1.0, 1.0))) == pytest.approx(
    1.0 - 1.5 * LOG2 + 0.75 * LOG3, abs=1e-6
  )
  # 2 * 1 + 3 * log(2) / 2 - (1/2)(2 log 2 - (3/4) log 3) = 2 + log(2) / 2 + (3/8) log 3
  assert float(rsl(out, weights(2.0, 3.0, 0.5))) == pytest.approx(
    2.0 + 0.5 * LOG2 + 0.375 * LOG3, abs=1e-6
  )
  # f counts assignments, not probabilities: both tokens on expert 0 -> f = (1, 0),
  # balance = 2 * Pbar_0 = 2 * 3/4.
  both = output([[1.0, 0.0], [0.5, 0.5]], [[0], [0]])
  assert float(rsl(both, weights(1.0, 0.0, 0.0))) == pytest.approx(1.5, abs=1e-6)


def simplex_grid(num_experts: int, steps: int):
  """Every distribution over num_experts whose entries are multiples of 1/steps."""
  for counts in itertools.product(range(steps + 1), repeat=num_experts):
    if sum(counts) == steps:
      yield tuple(c / steps for c in counts)


@pytest.mark.parametrize("num_experts,steps", [(2, 4), (3, 3)])
def test_minimum_is_one_hot_tokens_with_a_uniform_marginal(num_experts, steps):
  """Brute force: T = E tokens, each token's p on the grid, routed top-1 (ties to the
  lower index). The minimum of RSL at weights 1 is 1 - log E, reached exactly where
  every token is one-hot and every expert takes one token."""
  grid = list(simplex_grid(num_experts, steps))
  rows = np.asarray(list(itertools.product(grid, repeat=num_experts)), np.float32)  # [N, T, E]
  cfg = weights(1.0, 1.0, 1.0)

  def rsl_of(probs_te):
    return get_loss("rsl")(output(probs_te, jnp.argmax(probs_te, -1)[:, None]), cfg)

  values = np.asarray(jax.jit(jax.vmap(rsl_of))(jnp.asarray(rows)))  # argmax: ties to the lower
  best = values.min()
  assert best == pytest.approx(1.0 - math.log(num_experts), abs=1e-5)
  winners = rows[values <= best + 1e-5]
  for probs_te in winners:
    assert np.all(np.isin(probs_te, (0.0, 1.0))), probs_te  # one-hot tokens
    np.testing.assert_array_equal(probs_te.sum(0), np.ones(num_experts))  # uniform marginal
  assert len(winners) == math.factorial(num_experts)  # every assignment of tokens to experts


def test_negative_weight_is_refused_naming_the_key():
  c = base_config()
  c.model.moe.losses.rsl.token_entropy_weight = -0.5
  with pytest.raises(ConfigError, match=r"^model\.moe\.losses\.rsl\.token_entropy_weight=-0\.5 "):
    validate_part_settings(c.model.moe)
