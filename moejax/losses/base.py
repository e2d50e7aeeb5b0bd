"""Loss registry: fn(RouterOutput, cfg) -> unweighted float32 scalar.

`cfg` is the layer's MoE ConfigDict, so a loss can read its own settings
(e.g. model.moe.dpsl_alpha); losses that need none ignore it.
"""
from moejax.registry import Registry

LOSSES = Registry("model.moe.loss_weights")
register_loss = LOSSES.register
get_loss = LOSSES.get
