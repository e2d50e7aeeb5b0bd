"""Training an nnx classifier (the ViT, moejax/models/vit.py) on (inputs, labels,
allowed classes) batches: the one loop of the vision and continual-learning studies.

Each step is one optimizer step on the parameters a filter selects (`wanted`; the rest
frozen) of the mean cross-entropy over the allowed classes (the other logits set to
MASKED, as class-incremental methods train on the current task's classes), plus, with
`router_losses`, the model's weighted router losses (aux_loss). A `before_step` hook can
replace each batch's inputs at the current parameters (adversarial training,
moejax/train/adversarial.py); an `after_step` hook sees the model after every step
(FlyPrompt's EMA heads). The language models train with moejax/train/step.py instead.
"""

import functools
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

MASKED = -1e9  # the logit of a class outside the allowed ones


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def train_step(
  graphdef, optimizer, wanted, router_losses: bool, trained, state, rest, x, y, allowed, rng
):
  """One optimizer step on `trained` (the parameters `wanted` selects) -> (trained,
  optimizer state, rest); the new rest holds what the forward wrote (the router state
  a stateful router advances). Compiled once per model, optimizer and filter."""

  def loss_fn(trained):
    model = nnx.merge(graphdef, trained, rest)
    logits, aux, _ = model(x, train=True, rng=rng)
    logits = jnp.where(allowed, logits, MASKED)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    if router_losses:
      loss = loss + aux["aux_loss"]
    return loss, nnx.split(model, wanted, ...)[2]

  grads, new_rest = jax.grad(loss_fn, has_aux=True)(trained)
  updates, state = optimizer.update(grads, state, trained)
  return optax.apply_updates(trained, updates), state, new_rest


def trained_steps(
  model,
  wanted,
  optimizer,
  batches: Iterable,
  *,
  after_step: Callable | None = None,
  before_step: Callable | None = None,
  router_losses: bool = False,
  seed: int | None = None,
):
  """`model` after one step per (x, y, allowed) batch on the parameters `wanted` selects,
  from a fresh optimizer state (continual methods reset it per task).

  before_step(model, x, y, step) -> the inputs to train on (default x); after_step(model)
  is called after every step. seed: step k's forward gets the PRNG key
  fold_in(key(seed), k) (router jitter, as moejax/train/step.py); None: the model's
  fixed default key."""
  graphdef, trained, *others = nnx.split(model, wanted, ...)
  (rest,) = others  # what `wanted` leaves out: frozen parameters, router state
  state = optimizer.init(trained)
  for k, (x, y, allowed) in enumerate(batches):
    if before_step is not None:
      x = before_step(nnx.merge(graphdef, trained, rest), x, y, k)
    rng = None if seed is None else jax.random.fold_in(jax.random.key(seed), k)
    trained, state, rest = train_step(
      graphdef, optimizer, wanted, router_losses, trained, state, rest, x, y, allowed, rng
    )
    if after_step is not None:
      after_step(nnx.merge(graphdef, trained, rest))
  return nnx.merge(graphdef, trained, rest)


def batches(rng: np.random.Generator, inputs, labels, steps: int, size: int, allowed):
  """`steps` batches of `size` rows drawn uniformly (with replacement only when short)."""
  for _ in range(steps):
    rows = rng.choice(len(labels), size, replace=len(labels) < size)
    yield jnp.asarray(inputs[rows]), jnp.asarray(labels[rows]), allowed
