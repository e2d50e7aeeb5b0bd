"""Adversarial attacks on MoE classifiers, by name (`attack.name`): an l-infinity
projected-gradient loop (moejax/attacks/base.py) and one file per family that
registers its objectives in ATTACKS.

  pgd     cross-entropy, uniform steps (Madry et al. 2018)
  tlga_r  the routers pushed to their least-trusted experts, per-frame steps
  j_tlga  cross-entropy + router + expert terms, per-frame steps (arXiv 2602.01369)

    x_adv = attack_inputs("j_tlga", model, x, y, epsilon=8 / 255, steps=10)

Every registered attack meets one contract (tests/contract/test_attack_contract.py):
|x_adv - x|_inf <= epsilon, x_adv within the pixel range, epsilon = 0 gives x.
"""

from moejax.attacks import pgd, tlga  # noqa: F401  (each file registers its attacks)
from moejax.attacks.base import (
  ATTACKS,
  Attack,
  attack_inputs,
  frame_step_sizes,
  project,
  routing_flip_rate,
)

__all__ = ["ATTACKS", "Attack", "attack_inputs", "frame_step_sizes", "project", "routing_flip_rate"]
