"""Loss registry: fn(RouterOutput) -> unweighted float32 scalar."""
from moejax.registry import Registry

LOSSES = Registry("model.moe.loss_weights")
register_loss = LOSSES.register
get_loss = LOSSES.get
