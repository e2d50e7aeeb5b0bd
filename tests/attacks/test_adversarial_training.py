"""Adversarial training (moejax/train/adversarial.py): at epsilon = 0 every defence is
the plain train step, bit for bit; J-TLAT cycles router, expert and joint stages; a
defence trains on the stage's attack (PGD-AT at epsilon > 0 differs from plain
training); an unknown defence is refused naming the key."""

import jax
import numpy as np
import pytest
from flax import nnx

from moejax.data.moving_digits import moving_digits
from moejax.errors import ConfigError
from moejax.train.adversarial import DEFENCES, stage_of, train_classifier
from tests.attacks.helpers import shrink, untrained

STEPS = 3


def params(model):
  return jax.tree.leaves(nnx.state(model, nnx.Param))


def trained(defence=None, epsilon=0.0):
  videos, labels = moving_digits("train", 64, seed=0)
  return train_classifier(
    untrained(),
    shrink(videos),
    labels,
    steps=STEPS,
    batch=16,
    learning_rate=1e-2,
    seed=0,
    defence=defence,
    epsilon=epsilon,
    attack_steps=2,
  )


@pytest.fixture(scope="module")
def plain():
  return params(trained())


@pytest.mark.integration
@pytest.mark.parametrize("defence", list(DEFENCES))
def test_epsilon_zero_is_the_plain_train_step(plain, defence):
  for a, b in zip(params(trained(defence, 0.0)), plain):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.integration
def test_pgd_training_trains_on_the_attack(plain):
  moved = [np.max(np.abs(np.asarray(a - b))) for a, b in zip(params(trained("pgd_at", 0.1)), plain)]
  assert max(moved) > 1e-4


def test_j_tlat_cycles_router_expert_and_joint_stages():
  stages = [stage_of("j_tlat", step) for step in range(4)]
  assert stages == [
    ("tlga_r", {}),
    ("j_tlga", {"lambda_router": 0.0}),
    ("j_tlga", {}),
    ("tlga_r", {}),
  ]
  assert {stage_of("pgd_at", step)[0] for step in range(3)} == {"pgd"}


def test_an_unknown_defence_is_refused_naming_the_key():
  with pytest.raises(ConfigError, match="defence"):
    stage_of("trades", 0)
