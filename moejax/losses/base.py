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

Step-level statistics (gradient accumulation, moejax/train/step.py). A loss
that is a product of batch statistics is a different loss on each
micro-batch. If it is linear in what carries its gradient once its
non-differentiable batch statistics are fixed (the Switch load-balance loss
E * sum_e f_e P_e: f stop-gradient, P a token mean), it declares
`step_stats(out, cfg) -> {name: float32 sum over the call's tokens}` and
accepts them, `fn(out, cfg, step_stats=None)`: given the sums over the whole
step's batch, the mean over equal micro-batches of fn is the one-batch loss
and gradient. A loss whose batch dependence has no such form declares
`batch_statistic=reason` instead; train.balance_statistics='step' refuses it
with micro-batches (check_step_statistics).
"""

import dataclasses
from typing import Any, Callable

from moejax.errors import ConfigError
from moejax.registry import PartSettings, Registry


@dataclasses.dataclass(frozen=True)
class LossSpec:
  """A registered loss; called like its function. settings, legacy_keys and
  validate_settings as for routers (RouterSpec), in model.moe.losses.<name>;
  step_stats and batch_statistic as in the module doc."""

  name: str
  fn: Callable[..., Any]
  settings: tuple[tuple[str, Any], ...] = ()
  legacy_keys: tuple[tuple[str, str], ...] = ()
  validate_settings: Callable[[Any], None] | None = None
  step_stats: Callable[..., dict] | None = None
  batch_statistic: str | None = None

  def __call__(self, out, cfg=None, **kwargs):
    return self.fn(out, cfg, **kwargs)

  @property
  def config_section(self) -> PartSettings:
    """Its settings section, model.moe.losses.<name>."""
    return PartSettings(
      f"losses.{self.name}",
      f"loss {self.name!r}",
      self.settings,
      self.legacy_keys,
      self.validate_settings,
    )

  def options(self, cfg) -> dict:
    """This loss's settings from model.moe.losses.<name> of `cfg` (defaults where absent)."""
    return self.config_section.options(cfg)


LOSSES: Registry[LossSpec] = Registry("model.moe.loss_weights")
get_loss = LOSSES.get
LOSS_EXAMPLES: dict = {}  # name -> example (see module doc)


def register_loss(
  name: str,
  *,
  example=None,
  settings=None,
  legacy_keys=None,
  validate_settings=None,
  step_stats=None,
  batch_statistic=None,
):
  """Decorator: register loss `fn` under `name` (see LossSpec), with its
  hand-worked example if any; returns `fn` unchanged."""

  def wrap(fn):
    LOSSES.add(
      name,
      LossSpec(
        name,
        fn,
        tuple((settings or {}).items()),
        tuple((legacy_keys or {}).items()),
        validate_settings,
        step_stats,
        batch_statistic,
      ),
    )
    if example is not None:
      LOSS_EXAMPLES[name] = example
    return fn

  return wrap


def loss_value(name: str, out, cfg, step_stats: dict | None = None):
  """Loss `name` on `out`; with the step's statistics when it declares them and
  `step_stats` ({loss name: stats}) holds them."""
  spec = get_loss(name)
  if step_stats is not None and spec.step_stats is not None and name in step_stats:
    return spec(out, cfg, step_stats=step_stats[name])
  return spec(out, cfg)


def step_stats_of(names, out, cfg) -> dict:
  """{loss name: its step_stats on `out`} for those of `names` that declare them."""
  specs = {name: get_loss(name) for name in names}
  return {
    name: spec.step_stats(out, cfg) for name, spec in specs.items() if spec.step_stats is not None
  }


def needs_step_statistics(loss_weights) -> bool:
  """Whether a loss trained with weight > 0 declares step-level statistics."""
  return any(
    weight > 0 and get_loss(name).step_stats is not None for name, weight in loss_weights.items()
  )


def check_step_statistics(loss_weights, micro_batches: int, mode: str) -> None:
  """ConfigError for a weighted batch-statistic loss that micro-batches would change
  while train.balance_statistics='step' promises the one-batch step."""
  if micro_batches == 1 or mode != "step":
    return
  for name, weight in sorted(loss_weights.items()):
    reason = get_loss(name).batch_statistic
    if weight > 0 and reason:
      raise ConfigError(
        f"train.micro_batches={micro_batches} with train.balance_statistics='step' is not "
        f"supported with model.moe.loss_weights.{name}={weight}: "
        f"{reason} (train.balance_statistics='micro_batch' accepts it)"
      )
