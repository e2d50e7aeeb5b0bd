"""Loss registry."""
from typing import Callable

from moejax.errors import choice_error

LOSSES: dict[str, Callable] = {}


def register_loss(name: str):
  def wrap(fn):
    if name in LOSSES:
      raise ValueError(f"loss {name!r} registered twice")
    LOSSES[name] = fn
    return fn
  return wrap


def get_loss(name: str) -> Callable:
  if name not in LOSSES:
    raise choice_error("model.moe.loss_weights", name, LOSSES)
  return LOSSES[name]
