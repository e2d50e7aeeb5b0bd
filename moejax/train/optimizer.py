"""Parameter dtypes and the optimizer of a run.

Dtype policy: train.param_dtype is the dtype the parameters are stored (and
updated) in, except router parameters (any path component starting with
"router"), which stay float32 like all router math; train.opt_state_dtype is
the dtype of the optimizer moments, whose update is computed in float32;
model.dtype is the compute dtype.

The optimizer (make_optimizer) is optax's AdamW on a warmup-cosine schedule after
global-norm clipping; train.trainable other than 'all' restricts the update to a
part of the parameters (the rest get zero updates and no moments); a non-float32
param or optimizer-state dtype wraps it so its update is computed in float32.
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from moejax.adapters.projection import is_adapter_path
from moejax.models.decoder import DTYPES


def is_float(x) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def cast_floats(tree, dtype):
  return jax.tree.map(lambda x: x.astype(dtype) if is_float(x) else x, tree)


def is_router_path(path) -> bool:
  """Router parameters (router_kernel, router_params, router_x, ...) stay float32."""
  return any(str(key).startswith("router") for key in path)


def apply_param_dtype(model, param_dtype: str = "float32"):
  """Store `model`'s floating nnx.Params in `param_dtype`, router parameters excepted."""
  dtype = DTYPES[param_dtype]
  if dtype == jnp.float32:
    return model
  for path, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Param) and not is_router_path(path) and is_float(node.get_value()):
      node.set_value(node.get_value().astype(dtype))
  return model


def with_state_dtype(
  inner: optax.GradientTransformation, opt_state_dtype: str
) -> optax.GradientTransformation:
  """`inner` computed in float32 (gradients, params, state), its floating state
  stored in `opt_state_dtype`; updates come out float32 and
  optax.apply_updates casts the new params back to their own dtype."""
  dtype = DTYPES[opt_state_dtype]

  def init(params):
    return cast_floats(inner.init(cast_floats(params, jnp.float32)), dtype)

  def update(updates, state, params=None):
    updates, state = inner.update(
      cast_floats(updates, jnp.float32),
      cast_floats(state, jnp.float32),
      None if params is None else cast_floats(params, jnp.float32),
    )
    return updates, cast_floats(state, dtype)

  return optax.GradientTransformation(init, update)


TRAINED_PATHS = {  # train.trainable -> path (keys) -> whether the optimizer updates it
  "router": is_router_path,
  "prompt": lambda path: str(path[0]) in ("prompt", "head"),  # ViT prompt tuning
  "head": lambda path: str(path[0]) == "head",  # linear probe
  # LoRA-Mixer's two regimes (moejax/adapters/lora_mixer.py): the attention adapter
  # (LoRAs and routers) on a frozen base, or only the adapter's routers
  "adapter": is_adapter_path,
  "adapter_router": lambda path: is_adapter_path(path) and is_router_path(path),
}


def trained_labels(params, trainable: str):
  """The tree of `params` with 'trained' where TRAINED_PATHS[trainable] selects the
  parameter (every one for 'all'), 'frozen' elsewhere."""
  is_trained = TRAINED_PATHS.get(trainable, lambda path: True)
  return jax.tree_util.tree_map_with_path(
    lambda path, _: (
      "trained"
      if is_trained([getattr(k, "key", getattr(k, "name", k)) for k in path])
      else "frozen"
    ),
    params,
  )


def trained_count(params, trainable: str) -> int:
  """How many parameter values train.trainable=`trainable` trains."""
  labels = jax.tree.leaves(trained_labels(params, trainable))
  return sum(int(x.size) for x, label in zip(jax.tree.leaves(params), labels) if label == "trained")


def trained_only(
  inner: optax.GradientTransformation, trainable: str
) -> optax.GradientTransformation:
  """`inner` on the parameters TRAINED_PATHS[trainable] selects, zero updates and no
  optimizer state for every other parameter (train.trainable other than 'all')."""

  def labels(params):
    return trained_labels(params, trainable)

  return optax.multi_transform({"trained": inner, "frozen": optax.set_to_zero()}, labels)


def make_optimizer(t) -> optax.GradientTransformation:
  """AdamW with linear warmup and cosine decay, after global-norm clipping.

  Weight decay skips vectors (norm scales); matrices and embeddings decay.
  With a bfloat16 train.param_dtype or train.opt_state_dtype the update runs in
  float32 and the moments are kept in train.opt_state_dtype (with_state_dtype).
  """
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=t.learning_rate,
    warmup_steps=t.warmup_steps,
    decay_steps=max(t.steps, t.warmup_steps + 1),
    end_value=t.learning_rate * t.min_lr_ratio,
  )

  def decay_mask(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)

  chain = [optax.adamw(schedule, b1=t.b1, b2=t.b2, weight_decay=t.weight_decay, mask=decay_mask)]
  if t.grad_clip > 0:
    chain.insert(0, optax.clip_by_global_norm(t.grad_clip))
  optimizer = optax.chain(*chain)
  if t.get("trainable", "all") != "all":
    optimizer = trained_only(optimizer, t.trainable)
  param_dtype = t.get("param_dtype", "float32")
  opt_state_dtype = t.get("opt_state_dtype", "float32")
  if param_dtype != "float32" or opt_state_dtype != "float32":
    optimizer = with_state_dtype(optimizer, opt_state_dtype)
  return optimizer
