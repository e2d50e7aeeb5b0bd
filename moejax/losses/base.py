"""Loss registry: fn(RouterOutput, cfg) -> unweighted float32 scalar.

`cfg` is the layer's MoE ConfigDict, so a loss can read its own settings
(e.g. model.moe.dpsl_alpha); losses that need none ignore it. A loss that
does not apply to a router's output (e.g. it needs that router's metrics)
raises ConfigError.

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
from moejax.errors import ConfigError
from moejax.registry import Registry

LOSSES = Registry("model.moe.loss_weights")
get_loss = LOSSES.get
LOSS_EXAMPLES: dict = {}  # name -> example (see module doc)
LOSS_STEP_STATS: dict = {}  # name -> step_stats(out, cfg) (see module doc)
LOSS_BATCH_STATISTICS: dict = {}  # name -> why micro-batches change it (see module doc)


def register_loss(name: str, *, example=None, step_stats=None, batch_statistic=None):
  """Decorator: register loss `fn` under `name`, with its hand-worked example,
  step-level statistics or batch-statistic reason if any (module doc)."""

  def wrap(fn):
    LOSSES.add(name, fn)
    for table, value in ((LOSS_EXAMPLES, example), (LOSS_STEP_STATS, step_stats),
                         (LOSS_BATCH_STATISTICS, batch_statistic)):
      if value is not None:
        table[name] = value
    return fn

  return wrap


def loss_value(name: str, out, cfg, step_stats: dict | None = None):
  """Loss `name` on `out`; with the step's statistics when it declares them and
  `step_stats` ({loss name: stats}) holds them."""
  if step_stats is not None and name in LOSS_STEP_STATS and name in step_stats:
    return get_loss(name)(out, cfg, step_stats=step_stats[name])
  return get_loss(name)(out, cfg)


def step_stats_of(names, out, cfg) -> dict:
  """{loss name: its step_stats on `out`} for those of `names` that declare them."""
  return {name: LOSS_STEP_STATS[name](out, cfg) for name in names if name in LOSS_STEP_STATS}


def needs_step_statistics(loss_weights) -> bool:
  """Whether a loss trained with weight > 0 declares step-level statistics."""
  return any(weight > 0 and name in LOSS_STEP_STATS for name, weight in loss_weights.items())


def check_step_statistics(loss_weights, micro_batches: int, mode: str) -> None:
  """ConfigError for a weighted batch-statistic loss that micro-batches would change
  while train.balance_statistics='step' promises the one-batch step."""
  if micro_batches == 1 or mode != "step":
    return
  for name, weight in sorted(loss_weights.items()):
    if weight > 0 and name in LOSS_BATCH_STATISTICS:
      raise ConfigError(
          f"train.micro_batches={micro_batches} with train.balance_statistics='step' is not "
          f"supported with model.moe.loss_weights.{name}={weight}: "
          f"{LOSS_BATCH_STATISTICS[name]} (train.balance_statistics='micro_batch' accepts it)")
