"""Loss registry: a loss is fn(RouterOutput, cfg) -> unweighted float32 scalar.

`cfg` is the layer's MoE ConfigDict (None in some tests). A loss's own settings
are declared where it is registered (`register_loss(settings=...)`) and held in
the config section model.moe.losses.<name> (e.g. model.moe.losses.dpsl.alpha;
losses have their own namespace, so a loss may share a router's name); the loss
reads them with `get_loss(name).options(cfg)`. Its weight stays in
model.moe.loss_weights.<name>. A loss that does not apply to a router's output
(e.g. it needs that router's metrics) raises ConfigError.

A loss may declare a hand-enumerable `example`: a function of no arguments
returning (RouterOutput, cfg, expected value), small enough to work out on
paper; the contract tests (tests/contract/) check the loss against it.
"""
import dataclasses
from typing import Any, Callable

from moejax.registry import PartSettings, Registry


@dataclasses.dataclass(frozen=True)
class LossSpec:
  """A registered loss; called like its function. settings, legacy_keys and
  validate_settings as for routers (RouterSpec), in model.moe.losses.<name>."""
  name: str
  fn: Callable[..., Any]
  settings: tuple[tuple[str, Any], ...] = ()
  legacy_keys: tuple[tuple[str, str], ...] = ()
  validate_settings: Callable[[Any], None] | None = None

  def __call__(self, out, cfg=None):
    return self.fn(out, cfg)

  @property
  def config_section(self) -> PartSettings:
    """Its settings section, model.moe.losses.<name>."""
    return PartSettings(f"losses.{self.name}", f"loss {self.name!r}", self.settings,
                        self.legacy_keys, self.validate_settings)

  def options(self, cfg) -> dict:
    """This loss's settings from model.moe.losses.<name> of `cfg` (defaults where absent)."""
    return self.config_section.options(cfg)


LOSSES = Registry("model.moe.loss_weights")
get_loss = LOSSES.get
LOSS_EXAMPLES: dict = {}  # name -> example (see module doc)


def register_loss(name: str, *, example=None, settings=None, legacy_keys=None,
                  validate_settings=None):
  """Decorator: register loss `fn` under `name` (see LossSpec), with its
  hand-worked example if any; returns `fn` unchanged."""

  def wrap(fn):
    LOSSES.add(name, LossSpec(name, fn, tuple((settings or {}).items()),
                              tuple((legacy_keys or {}).items()), validate_settings))
    if example is not None:
      LOSS_EXAMPLES[name] = example
    return fn

  return wrap
