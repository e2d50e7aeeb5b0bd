"""Pure train and eval steps over a TrainState of plain pytrees.

The model lives as (graphdef, params, rest): `params` are the trained
nnx.Params as a pure dict, `rest` every other variable (router state such as
the aux-loss-free bias) as a pure dict. A step merges them into a module,
runs it, and splits the updated `rest` back out, so router state updates need
no trainer code.

With a Placement (moejax/train/distributed.py) the steps are jitted with its
shardings and traced under its mesh Layout; without one, plain jax.jit.

Gradient accumulation (train.micro_batches = M > 1). One jitted step splits
its batch [B, ...] into M micro-batches of B/M rows, runs forward and backward
on each inside a jax.lax.scan (one micro-batch's activations live at a time),
sums the gradients in float32 and divides by M, and updates the optimizer
once. The split is strided: micro-batch m holds rows m, m + M, m + 2M, ...
([B, ...] -> [B/M, M, ...] -> swap -> [M, B/M, ...]). The batch arrives split
over the data axes in contiguous blocks of B/D rows per shard, and every such
block holds B/(D*M) rows of every micro-batch, so each micro-batch stays split
over all the data shards with no data movement (config validation requires M
to divide B/D); a contiguous split would put each micro-batch on a few shards.
The loss is a mean over tokens and every micro-batch has B/M rows of the same
length, so the mean of the micro-batch gradients is the gradient of the whole
batch, up to float32 summation order. Losses and metrics are the means of the
micro-batch values (exact for token means such as the loss, z-loss and load
fractions; a batch-level statistic such as max_over_mean_load becomes the mean
of its micro-batch values). The step's PRNG key is folded with the micro-batch
index (with M = 1 it is the step key, so M = 1 is the program it always was).

Step-level loss statistics (train.balance_statistics). The Switch load-balance
loss E * sum_e f_e P_e is a product of two batch means, so on a micro-batch it
is a different loss. Its gradient flows through P only (f is stop-gradient)
and it is linear in P given f: with the step's f in every micro-batch, the
mean over micro-batches is the one-batch loss and gradient. 'step' (default)
does two passes when a weighted loss declares step statistics
(moejax/losses/base.py): a forward-only scan over the micro-batches (same
routing as the grad scan: train=True, the same keys, the step's router state,
its state writes dropped) sums each MoE layer's aux["step_stats"], then the
grad scan hands the sums to every layer (Decoder(step_stats=...), loop,
rematerialised and scanned blocks alike). Cost: one more forward per step
(about a third more compute; nothing reads its logits). The logged
load_balance is then the one-batch value too (with no weighted loss that
declares step statistics there is no extra pass, and it is the mean of the
micro-batch values, like max_over_mean_load). 'micro_batch' gives each
micro-batch its own f (MaxText / Megatron practice; no extra forward). On the
tiny model, 4 x 8 vs 1 x 32 with the default loss weights (load_balance 1e-2,
z_loss 1e-3): gradients differ by 7.5e-9 with 'step' and by 2.6e-5 (sigmoid_bias)
/ 5.7e-5 (topk) with 'micro_batch' (tests/train/test_grad_accumulation.py). A
loss that is a batch statistic without such a form (dpsl) is refused with
'step' and M > 1.

Router state (moejax/routing/base.py, "the state-update protocol"): every
micro-batch routes with the state from the start of the step; the step sums
each layer's reported router stats over the micro-batches and applies the
router's update_state once, so the state after the step equals the one-batch
state. The rest of `rest` is carried over unchanged; config validation refuses
M > 1 for stateful routing without the protocol (and for OmniMoE, whose
BatchNorm routing normalises over the tokens of each call). Routers that
couple the tokens of one call (expert choice, token rounding, capacity drops,
optimal transport) route each micro-batch on its own: a smaller routing group,
not the one-batch function.

Parameter dtypes and the optimizer (train.param_dtype, opt_state_dtype, trainable)
are moejax/train/optimizer.py's.
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from moejax import losses, sharding
from moejax.layers.moe import MoELayer, RouterStats
from moejax.train.optimizer import is_float


@struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar
  params: dict
  rest: dict
  opt_state: optax.OptState


def split_model(model):
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return graphdef, nnx.to_pure_dict(params), nnx.to_pure_dict(rest)


def cross_entropy(logits, targets):
  """Mean next-token cross-entropy in nats, float32."""
  return jnp.mean(
    optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  )


def moe_metrics(aux) -> list:
  """Per MoE layer, the metrics of the model's aux (the routing itself stays on device)."""
  return [layer["metrics"] for layer in aux["moe"]]


def jit_on_mesh(fn, layout, **jit_kwargs):
  """jax.jit(fn) traced under a mesh Layout: activation constraints and expert
  parallelism switch on inside (moejax/sharding.py)."""

  def traced_on_mesh(*args):
    with sharding.use_layout(layout):
      return fn(*args)

  return jax.jit(traced_on_mesh, **jit_kwargs)


def split_micro_batches(batch: dict, micro_batches: int) -> dict:
  """[B, ...] -> [M, B/M, ...], micro-batch m = rows m, m + M, ... (strided: each
  micro-batch keeps rows on every data shard; see the module doc)."""

  def split(x):
    x = x.reshape(x.shape[0] // micro_batches, micro_batches, *x.shape[1:]).swapaxes(0, 1)
    return sharding.constrain(x, (None, "batch", "length", *[None] * (x.ndim - 3))[: x.ndim])

  return jax.tree.map(split, batch)


def _modules_by_path(model) -> list:
  """(module, 'blocks/0/ffn') for every submodule of `model`."""
  return [
    (node, "/".join(map(str, path)))
    for path, node in nnx.iter_graph(model)
    if isinstance(node, nnx.Module)
  ]


def make_loss_fn(graphdef, objective=None):
  """(params, rest, batch, rng, step_stats=None) -> (loss, (ce, aux, new_rest, router_stats)).

  router_stats: {layer path: the stats its router reported} (the state-update
  protocol of moejax/routing/base.py). step_stats: the step's loss statistics per
  MoE layer (Decoder), or None for the batch's own. objective: a task's term
  (moejax/train/tasks.py), objective(model, logits, batch, hidden) -> (float32 scalar
  added to the loss, {metric: scalar} logged beside it, in aux["task"]); hidden is the
  model's final hidden state [B, L, d] when the objective has `student_hidden` True,
  else None.
  """
  with_hidden = {"with_hidden": True} if getattr(objective, "student_hidden", False) else {}

  def loss_fn(params, rest, batch, rng, step_stats=None):
    model = nnx.merge(graphdef, params, rest)
    (logits, model_aux, _), sown = nnx.capture(model, RouterStats)(
      batch["inputs"], train=True, rng=rng, step_stats=step_stats, **with_hidden
    )
    aux = {"aux_loss": model_aux["aux_loss"], "moe": moe_metrics(model_aux)}  # routing stays
    ce = cross_entropy(logits, batch["targets"])
    extra = jnp.zeros((), jnp.float32)
    if objective is not None:
      extra, aux["task"] = objective(model, logits, batch, model_aux.get("final_hidden"))
    # {'blocks/0/ffn': stats}: what each MoE layer sowed on its one call. (A scanned
    # block sows stacked stats; config refuses micro-batching with a stateful router
    # there or under remat, so only the loop's layers reach apply_router_updates.)
    stats = {
      "/".join(map(str, path[:-1])): var.get_value()[-1] for path, var in nnx.to_flat_state(sown)
    }
    _, _, new_rest = split_model(model)
    return ce + aux["aux_loss"] + extra, (ce, aux, new_rest, stats)

  return loss_fn


def apply_router_updates(graphdef, params, rest, stats: dict) -> dict:
  """`rest` with each reporting layer's router state advanced once by
  update_state(state, summed stats, its RouterConfig); everything else unchanged."""
  model = nnx.merge(graphdef, params, rest)
  layers = {path: node for node, path in _modules_by_path(model)}
  for key, layer_stats in stats.items():
    layer = layers[key]
    state = {name: var.get_value() for name, var in layer.router_state.items()}
    new_state = layer.router_spec.update_state(state, layer_stats, layer.router_config)
    for name, var in layer.router_state.items():
      var.set_value(jax.lax.stop_gradient(new_state[name]).astype(var.get_value().dtype))
  return split_model(model)[2]


def _mean_over_micro_batches(x):
  mean = jnp.mean(x, axis=0)
  return mean.astype(x.dtype) if is_float(x) else mean


def needs_step_statistics(model) -> bool:
  """Whether a MoE layer of `model` trains a loss that declares step-level statistics."""
  return any(
    isinstance(node, MoELayer) and losses.needs_step_statistics(node.cfg.loss_weights)
    for _, node in nnx.iter_graph(model)
  )


def make_step_statistics_fn(graphdef, micro_batches: int):
  """(params, rest, micro [M, B/M, ...], rng) -> per MoE layer, the step's loss
  statistics: a forward-only scan over the micro-batches (the grad scan's routing:
  train=True, the same keys, the step's router state; its state writes dropped)
  summing each layer's aux["step_stats"]."""

  def step_statistics(params, rest, micro, rng):
    def body(_, xs):
      micro_batch, index = xs
      model = nnx.merge(graphdef, params, rest)
      _, aux, _ = model(micro_batch["inputs"], train=True, rng=jax.random.fold_in(rng, index))
      return None, [layer.get("step_stats", {}) for layer in aux["moe"]]

    _, stats = jax.lax.scan(body, None, (micro, jnp.arange(micro_batches)))
    return jax.lax.stop_gradient(jax.tree.map(lambda x: jnp.sum(x, axis=0), stats))

  return step_statistics


def make_grad_fn(
  graphdef, micro_batches: int = 1, balance_statistics: str = "step", objective=None
):
  """(params, rest, batch, rng) -> (grads, metrics, new_rest) of one optimizer step.

  metrics: loss, ce_loss, aux_loss, moe (per-layer metrics), grad_norm. With
  micro_batches > 1: float32 gradients averaged over strided micro-batches,
  metrics averaged, router state updated once from the summed stats; with
  balance_statistics='step' losses with step-level statistics use the whole
  step's (module doc). objective: make_loss_fn's; its metrics are logged too.
  """
  loss_fn = make_loss_fn(graphdef, objective)
  value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)

  def metrics_of(loss, ce, aux, grads):
    return {
      "loss": loss,
      "ce_loss": ce,
      "aux_loss": aux["aux_loss"],
      "grad_norm": optax.tree.norm(grads),
      "moe": aux["moe"],
      **aux.get("task", {}),
    }

  def one_batch(params, rest, batch, rng):
    (loss, (ce, aux, new_rest, _)), grads = value_and_grad(params, rest, batch, rng)
    return grads, metrics_of(loss, ce, aux, grads), new_rest

  step_statistics = make_step_statistics_fn(graphdef, micro_batches)

  def accumulated(params, rest, batch, rng):
    micro = split_micro_batches(batch, micro_batches)
    step_stats = None
    if balance_statistics == "step" and needs_step_statistics(nnx.merge(graphdef, params, rest)):
      step_stats = step_statistics(params, rest, micro, rng)

    def body(grad_sum, xs):
      micro_batch, index = xs
      (loss, (ce, aux, _, stats)), grads = value_and_grad(
        params, rest, micro_batch, jax.random.fold_in(rng, index), step_stats
      )
      grad_sum = jax.tree.map(lambda s, g: s + g.astype(jnp.float32), grad_sum, grads)
      return grad_sum, (loss, ce, aux, stats)

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    grad_sum, (loss, ce, aux, stats) = jax.lax.scan(body, zeros, (micro, jnp.arange(micro_batches)))
    grads = jax.tree.map(lambda g: g / micro_batches, grad_sum)
    loss, ce, aux = jax.tree.map(_mean_over_micro_batches, (loss, ce, aux))
    stats = jax.tree.map(lambda x: jnp.sum(x, axis=0), stats)
    new_rest = apply_router_updates(graphdef, params, rest, stats)
    return grads, metrics_of(loss, ce, aux, grads), new_rest

  return one_batch if micro_batches == 1 else accumulated


def train_step_fn(
  graphdef, optimizer, micro_batches: int = 1, balance_statistics: str = "step", objective=None
):
  """The unjitted step (state, batch, base_key) -> (new state, metrics); its PRNG
  key is fold_in(base_key, state.step). make_train_step closes it over the seed's
  key and jits it; it can also be vmapped over stacked states, batches and keys."""
  grad_fn = make_grad_fn(graphdef, micro_batches, balance_statistics, objective)

  def train_step(state: TrainState, batch, base_key):
    rng = jax.random.fold_in(base_key, state.step)
    grads, metrics, new_rest = grad_fn(state.params, state.rest, batch, rng)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(state.step + 1, params, new_rest, opt_state), metrics

  return train_step


def make_train_step(
  graphdef,
  optimizer,
  seed: int,
  placement=None,
  micro_batches: int = 1,
  balance_statistics: str = "step",
  objective=None,
):
  base_key = jax.random.key(seed)
  step_fn = train_step_fn(graphdef, optimizer, micro_batches, balance_statistics, objective)

  def train_step(state: TrainState, batch):
    return step_fn(state, batch, base_key)

  if placement is None:
    return jax.jit(train_step, donate_argnums=0)
  return jit_on_mesh(
    train_step,
    placement.layout,
    donate_argnums=0,
    in_shardings=(placement.state, placement.batch),
    out_shardings=(placement.state, placement.replicated),
  )


def make_eval_step(graphdef, placement=None, score=None):
  """(params, rest, batch) -> (score(logits, batch), per-layer MoE metrics); score
  defaults to the mean cross-entropy against batch["targets"] (moejax/train/tasks.py)."""

  def eval_step(params, rest, batch):
    model = nnx.merge(graphdef, params, rest)
    logits, aux, _ = model(batch["inputs"], train=False)
    if score is not None:
      return score(logits, batch), moe_metrics(aux)
    return cross_entropy(logits, batch["targets"]), moe_metrics(aux)

  if placement is None:
    return jax.jit(eval_step)
  return jit_on_mesh(
    eval_step,
    placement.layout,
    out_shardings=placement.replicated,
    in_shardings=(placement.state.params, placement.state.rest, placement.batch),
  )
