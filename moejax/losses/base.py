"""Loss registry: fn(RouterOutput, cfg) -> unweighted float32 scalar.

`cfg` is the layer's MoE ConfigDict, so a loss can read its own settings
(e.g. model.moe.dpsl_alpha); losses that need none ignore it. A loss that
does not apply to a router's output (e.g. it needs that router's metrics)
raises ConfigError.

A loss may declare a hand-enumerable `example`: a function of no arguments
returning (RouterOutput, cfg, expected value), small enough to work out on
paper; the contract tests (tests/contract/) check the loss against it.
"""
from moejax.registry import Registry

LOSSES = Registry("model.moe.loss_weights")
get_loss = LOSSES.get
LOSS_EXAMPLES: dict = {}  # name -> example (see module doc)


def register_loss(name: str, *, example=None):
  """Decorator: register loss `fn` under `name`, with its hand-worked example if any."""

  def wrap(fn):
    LOSSES.add(name, fn)
    if example is not None:
      LOSS_EXAMPLES[name] = example
    return fn

  return wrap
