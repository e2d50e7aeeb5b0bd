"""Router losses: pure functions of a RouterOutput, registered by name.

Each loss returns an unweighted float32 scalar; the MoE layer multiplies by
the weight from `model.moe.loss_weights[name]`.
"""
from moejax.losses.base import LOSSES, LossSpec, get_loss, register_loss
from moejax.registry import import_package_modules

import_package_modules(__name__, __path__)  # every loss module registers its losses
