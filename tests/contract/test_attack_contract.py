"""Every registered attack (moejax/attacks/ ATTACKS) keeps its budget: x_adv - x within
[-epsilon, epsilon] and x_adv within the pixel range [0, 1], exactly in float32, even
with steps much larger than epsilon and pixels at the range's ends; epsilon = 0 gives
the input back bit for bit; an unknown name is refused naming attack.name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.attacks import ATTACKS, attack_inputs
from moejax.errors import ConfigError
from tests.attacks.helpers import FRAMES, untrained


def clips():
  x = jax.random.uniform(jax.random.key(3), (4, FRAMES, 8, 8, 1), jnp.float32)
  return x.at[:, :, :2].set(0.0).at[:, :, -2:].set(1.0)  # rows at both ends of the range


@pytest.mark.parametrize("name", list(ATTACKS))
@pytest.mark.parametrize("epsilon", [0.03, 0.3])
def test_the_perturbation_stays_in_the_ball_and_the_pixel_range(name, epsilon):
  model, x = untrained(), clips()
  y = jnp.arange(4) % 8
  x_adv = attack_inputs(name, model, x, y, epsilon=epsilon, steps=3, step_size=0.7)
  delta = np.asarray(x_adv - x)  # float32, as the attack sees it
  assert np.max(np.abs(delta)) <= np.float32(epsilon)
  assert np.max(np.abs(delta)) > 0.9 * epsilon  # it moved: the check is not vacuous
  assert np.min(np.asarray(x_adv)) >= 0.0 and np.max(np.asarray(x_adv)) <= 1.0


@pytest.mark.parametrize("name", list(ATTACKS))
def test_epsilon_zero_returns_the_input_exactly(name):
  model, x = untrained(), clips()
  x_adv = attack_inputs(name, model, x, jnp.zeros(4, jnp.int32), epsilon=0.0, steps=2)
  np.testing.assert_array_equal(np.asarray(x_adv), np.asarray(x))


def test_the_registry_holds_the_three_attacks_and_refuses_others():
  assert list(ATTACKS) == ["pgd", "tlga_r", "j_tlga"]
  with pytest.raises(ConfigError, match="attack.name"):
    attack_inputs("fgsm", untrained(), clips(), jnp.zeros(4, jnp.int32), epsilon=0.1)
