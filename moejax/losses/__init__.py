"""Router losses: pure functions of a RouterOutput, registered by name.

Each loss returns an unweighted float32 scalar from a RouterOutput and its
LossConfig (base.py); the MoE layer multiplies by the weight from
`model.moe.loss_weights[name]`.
"""

from moejax.losses.base import (
  LOSSES,
  LossConfig,
  LossSpec,
  check_step_statistics,
  get_loss,
  loss_config,
  loss_configs,
  loss_value,
  needs_step_statistics,
  register_loss,
  step_stats_of,
)
from moejax.registry import import_package_modules

import_package_modules(__name__, __path__)  # every loss module registers its losses

__all__ = [
  "LOSSES",
  "LossConfig",
  "LossSpec",
  "check_step_statistics",
  "get_loss",
  "loss_config",
  "loss_configs",
  "loss_value",
  "needs_step_statistics",
  "register_loss",
  "step_stats_of",
]
