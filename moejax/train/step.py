"""Pure train and eval steps over a TrainState of plain pytrees.

The model lives as (graphdef, params, rest): `params` are the trained
nnx.Params as a pure dict, `rest` every other variable (router state such as
the aux-loss-free bias) as a pure dict. A step merges them into a module,
runs it, and splits the updated `rest` back out, so router state updates need
no trainer code.

With a Placement (moejax/train/distributed.py) the steps are jitted with its
shardings and traced under its mesh Layout; without one, plain jax.jit.
"""
import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from moejax import sharding


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
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), targets))


def moe_metrics(aux) -> list:
  """Per MoE layer, the metrics of the model's aux (the routing itself stays on device)."""
  return [layer["metrics"] for layer in aux["moe"]]


def make_optimizer(t) -> optax.GradientTransformation:
  """AdamW with linear warmup and cosine decay, after global-norm clipping.

  Weight decay skips vectors (norm scales); matrices and embeddings decay.
  """
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=t.learning_rate, warmup_steps=t.warmup_steps,
      decay_steps=max(t.steps, t.warmup_steps + 1), end_value=t.learning_rate * t.min_lr_ratio)
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  chain = [optax.adamw(schedule, b1=t.b1, b2=t.b2, weight_decay=t.weight_decay,
                       mask=decay_mask)]
  if t.grad_clip > 0:
    chain.insert(0, optax.clip_by_global_norm(t.grad_clip))
  return optax.chain(*chain)


def jit_on_mesh(fn, layout, **jit_kwargs):
  """jax.jit(fn) traced under a mesh Layout: activation constraints and expert
  parallelism switch on inside (moejax/sharding.py)."""

  def traced_on_mesh(*args):
    with sharding.use_layout(layout):
      return fn(*args)

  return jax.jit(traced_on_mesh, **jit_kwargs)


def make_train_step(graphdef, optimizer, seed: int, placement=None):
  base_key = jax.random.key(seed)

  def loss_fn(params, rest, batch, rng):
    model = nnx.merge(graphdef, params, rest)
    logits, aux, _ = model(batch["inputs"], train=True, rng=rng)
    ce = cross_entropy(logits, batch["targets"])
    _, _, new_rest = split_model(model)
    return ce + aux["aux_loss"], (ce, aux, new_rest)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(base_key, state.step)
    (loss, (ce, aux, new_rest)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, state.rest, batch, rng)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "ce_loss": ce, "aux_loss": aux["aux_loss"],
               "grad_norm": optax.tree.norm(grads), "moe": moe_metrics(aux)}
    return TrainState(state.step + 1, params, new_rest, opt_state), metrics

  if placement is None:
    return jax.jit(train_step, donate_argnums=0)
  return jit_on_mesh(train_step, placement.layout, donate_argnums=0,
                     in_shardings=(placement.state, placement.batch),
                     out_shardings=(placement.state, placement.replicated))


def make_eval_step(graphdef, placement=None):

  def eval_step(params, rest, batch):
    model = nnx.merge(graphdef, params, rest)
    logits, aux, _ = model(batch["inputs"], train=False)
    return cross_entropy(logits, batch["targets"]), moe_metrics(aux)

  if placement is None:
    return jax.jit(eval_step)
  return jit_on_mesh(eval_step, placement.layout, out_shardings=placement.replicated,
                     in_shardings=(placement.state.params, placement.state.rest,
                                   placement.batch))
