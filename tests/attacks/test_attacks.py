"""Oracles for the attacks (moejax/attacks/) on a tiny trained video MoE: the joint
attack (J-TLGA) leaves no more predictions intact than PGD at two budgets; the router
attack (TLGA-R) changes more routing decisions than PGD; the per-frame Lipschitz step
is the formula by hand; a negative budget is one ConfigError line naming the key."""

import numpy as np
import pytest

from moejax.attacks import attack_inputs, frame_step_sizes, routing_flip_rate
from moejax.errors import ConfigError
from tests.attacks.helpers import accuracy, trained_model_and_clips

EPSILONS = (0.02, 0.05)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_the_joint_attack_is_at_least_as_strong_as_pgd(epsilon):
  model, x, y = trained_model_and_clips()
  pgd = accuracy(model, attack_inputs("pgd", model, x, y, epsilon=epsilon), y)
  joint = accuracy(model, attack_inputs("j_tlga", model, x, y, epsilon=epsilon), y)
  assert 0.0 < pgd < 1.0  # the budget matters: neither attack trivially wins
  assert joint <= pgd


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_the_router_attack_flips_more_routing_than_pgd(epsilon):
  model, x, y = trained_model_and_clips()
  pgd = routing_flip_rate(model, x, attack_inputs("pgd", model, x, y, epsilon=epsilon))
  router = routing_flip_rate(model, x, attack_inputs("tlga_r", model, x, y, epsilon=epsilon))
  assert router > 1.2 * pgd > 0


def test_the_per_frame_step_is_the_lipschitz_share_by_hand():
  g = np.zeros((2, 3, 2, 2, 1), np.float32)
  g[0, 0] = 3.0  # ||g||_2 = 6 (four pixels of 3)
  g[0, 1, 0, 0] = 4.0  # 4
  g[0, 2] = 0.0  # 0: the frame takes no step
  sizes = np.asarray(frame_step_sizes(g, 0.5))
  assert sizes.shape == (2, 3, 1, 1, 1)
  np.testing.assert_allclose(sizes[0].ravel(), [0.5 * 3 * 6 / 10, 0.5 * 3 * 4 / 10, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(sizes[1].ravel(), [0.5] * 3)  # zero gradient: alpha each


def test_the_router_attack_moves_no_prediction_target():
  """TLGA-R's objective reads no label: any labels give the same x_adv."""
  model, x, y = trained_model_and_clips()
  a = attack_inputs("tlga_r", model, x, y, epsilon=0.02, steps=3)
  b = attack_inputs("tlga_r", model, x, (y + 1) % 8, epsilon=0.02, steps=3)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
  ("kwargs", "message"),
  [
    ({"epsilon": -0.1}, r"^attack\.epsilon=-0\.1 must be a finite number >= 0$"),
    ({"epsilon": float("nan")}, r"^attack\.epsilon=nan must be"),
    ({"epsilon": 0.1, "steps": 0}, r"^attack\.steps=0 must be an int >= 1$"),
    ({"epsilon": 0.1, "step_size": 0.0}, r"^attack\.step_size=0\.0 must be a finite number > 0$"),
  ],
)
def test_bad_budgets_are_one_line_errors_naming_the_key(kwargs, message):
  model, x, y = trained_model_and_clips()
  with pytest.raises(ConfigError, match=message):
    attack_inputs("pgd", model, x, y, **kwargs)
