"""Loss registry: a loss is fn(RouterOutput, cfg) -> unweighted float32 scalar.

`cfg` is the loss's LossConfig, never the model.moe ConfigDict: a frozen,
hashable object that `loss_config(spec, moe)`, the one function that reads
model.moe for losses, builds once, where the MoE layer (or an adapter) is built.
It holds the loss's own settings, parsed (`cfg.settings`): declared where the loss
is registered (`register_loss(settings=...)`), held in the config section
model.moe.losses.<name> (e.g. model.moe.losses.dpsl.alpha; losses have their own
namespace, so a loss may share a router's name), with their defaults where a
section or key is absent. Shared model.moe keys a loss needs join LossConfig
there. A LossSpec called without cfg runs at its defaults; with anything but a
LossConfig it raises TypeError. Its weight stays in model.moe.loss_weights.<name>,
applied by the layer. A loss that does not apply to a router's output (e.g. it
needs that router's metrics) raises ConfigError.

A loss may declare a hand-enumerable `example`: a function of no arguments
returning (RouterOutput, LossConfig or None, expected value), small enough to
work out on paper; the contract tests (tests/contract/) check the loss against it.

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
from moejax.registry import PartSettings, Registry, Settings


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """What a loss reads (the module doc): its own settings, model.moe.losses.<name>,
  parsed. Frozen and hashable (a static attribute of the layers). Built by
  `loss_config`."""

  settings: Settings


@dataclasses.dataclass(frozen=True)
class LossSpec:
  """A registered loss; called like its function, on its LossConfig (the module
  doc; None: its defaults). settings and legacy_keys as for routers (RouterSpec),
  in model.moe.losses.<name>; validate_settings: LossConfig -> None, ConfigError
  naming model.moe.losses.<name>.<key> and the value, checked whether or not the
  loss is weighted; step_stats and batch_statistic as in the module doc."""

  name: str
  fn: Callable[..., Any]
  settings: tuple[tuple[str, Any], ...] = ()
  legacy_keys: tuple[tuple[str, str], ...] = ()
  validate_settings: Callable[[Any], None] | None = None
  step_stats: Callable[..., dict] | None = None
  batch_statistic: str | None = None

  def __call__(self, out, cfg: LossConfig | None = None, **kwargs):
    return self.fn(out, self.checked(cfg), **kwargs)

  def checked(self, cfg: LossConfig | None) -> LossConfig:
    """`cfg`, or the defaults for None; TypeError for anything but a LossConfig
    (e.g. the model.moe ConfigDict: losses receive their parsed config)."""
    if cfg is None:
      return loss_config(self, None)
    if not isinstance(cfg, LossConfig):
      raise TypeError(
        f"loss {self.name!r} takes a LossConfig (losses.loss_config), not {type(cfg).__name__}"
      )
    return cfg

  @property
  def config_section(self) -> PartSettings:
    """Its settings section, model.moe.losses.<name>; its check runs
    validate_settings on the LossConfig of the model.moe it checks."""
    check = None if self.validate_settings is None else self._check_settings
    return PartSettings(
      f"losses.{self.name}", f"loss {self.name!r}", self.settings, self.legacy_keys, check
    )

  def _check_settings(self, moe) -> None:
    if self.validate_settings is not None:
      self.validate_settings(loss_config(self, moe))


LOSSES: Registry[LossSpec] = Registry("model.moe.loss_weights")
get_loss = LOSSES.get
LOSS_EXAMPLES: dict = {}  # name -> example (see module doc)


def loss_config(spec: LossSpec | str, moe) -> LossConfig:
  """The LossConfig of loss `spec` (or its name) from `moe`, a model.moe ConfigDict
  (None: the defaults): the one place that maps model.moe to what losses read
  (ConfigError for a flat key of older configs)."""
  spec = get_loss(spec) if isinstance(spec, str) else spec
  return LossConfig(spec.config_section.parse(moe))


def loss_configs(names, moe) -> Settings:
  """{name: LossConfig} of the losses `names` from `moe`, frozen: what a layer keeps
  from model.moe for its losses, built once."""
  return Settings({name: loss_config(name, moe) for name in names})


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


def loss_value(name: str, out, cfg: LossConfig, step_stats: dict | None = None):
  """Loss `name` on `out` with its LossConfig `cfg`; with the step's statistics when
  it declares them and `step_stats` ({loss name: stats}) holds them."""
  spec = get_loss(name)
  if step_stats is not None and spec.step_stats is not None and name in step_stats:
    return spec(out, cfg, step_stats=step_stats[name])
  return spec(out, cfg)


def step_stats_of(configs, out) -> dict:
  """{loss name: its step_stats on `out`} for the losses of `configs` ({name:
  LossConfig}, loss_configs) that declare them."""
  specs = {name: get_loss(name) for name in configs}
  return {
    name: spec.step_stats(out, spec.checked(configs[name]))
    for name, spec in specs.items()
    if spec.step_stats is not None
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
