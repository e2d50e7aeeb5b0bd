"""Oracles for the attacks (moejax/attacks/) on a tiny trained video MoE: TLGA-R reaches
a higher value of its router objective than PGD does and changes routing decisions;
J-TLGA raises its joint objective above the clean input's; the per-frame Lipschitz
step is the formula by hand; a negative budget is one ConfigError line naming the key.

The paper's empirical comparisons (J-TLGA leaves fewer predictions intact than PGD;
TLGA-R flips more routing) are the video_attacks study's, over seeds with intervals:
on this one model they hold or fail by a clip with the compiler flags
(docs/results/attacks_test_model_cpu.md), so a test cannot assert them.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.attacks import attack_inputs, frame_step_sizes, routing_flip_rate
from moejax.attacks.base import ATTACKS, settings_for
from moejax.data.moving_digits import moving_digits
from moejax.errors import ConfigError
from tests.attacks.helpers import accuracy, shrink, trained_model_and_clips, untrained

EPSILONS = (0.02, 0.05)


def objective_at(name, model, x, y, x_adv):
  """The registered attack `name`'s objective at x_adv (its clean reading from x)."""
  attack = ATTACKS.get(name)
  settings = settings_for(attack)
  return float(attack.objective(model, x_adv, y, attack.prepare(model, x, settings), settings))


@pytest.mark.integration
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_the_joint_attack_raises_its_objective_and_breaks_predictions(epsilon):
  model, x, y = trained_model_and_clips()
  pgd = attack_inputs("pgd", model, x, y, epsilon=epsilon)
  joint = attack_inputs("j_tlga", model, x, y, epsilon=epsilon)
  assert 0.0 < accuracy(model, pgd, y) < 1.0  # the budget matters: no attack trivially wins
  assert accuracy(model, joint, y) < 1.0
  assert objective_at("j_tlga", model, x, y, joint) > objective_at("j_tlga", model, x, y, x)


@pytest.mark.integration
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_the_router_attack_reaches_a_higher_router_objective_than_pgd_and_flips_routing(epsilon):
  model, x, y = trained_model_and_clips()
  pgd = attack_inputs("pgd", model, x, y, epsilon=epsilon)
  router = attack_inputs("tlga_r", model, x, y, epsilon=epsilon)
  at_router, at_pgd = (objective_at("tlga_r", model, x, y, a) for a in (router, pgd))
  assert at_router > at_pgd
  assert routing_flip_rate(model, x, router) > 0.05


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
  """TLGA-R's objective reads no label: any labels give the same x_adv (on any model:
  an untrained one here)."""
  model = untrained()
  x = jnp.asarray(shrink(moving_digits("test", 8, seed=0)[0]))
  y = jnp.arange(8) % 8
  a = attack_inputs("tlga_r", model, x, y, epsilon=0.02, steps=3)
  b = attack_inputs("tlga_r", model, x, (y + 1) % 8, epsilon=0.02, steps=3)
  assert float(jnp.max(jnp.abs(a - x))) > 0.0  # the attack moved the clips
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
  model = untrained()  # refused before the model is read
  x = jnp.asarray(shrink(moving_digits("test", 2, seed=0)[0]))
  y = jnp.zeros((2,), jnp.int32)
  with pytest.raises(ConfigError, match=message):
    attack_inputs("pgd", model, x, y, **kwargs)
