"""Projection adapters: a trained term added to the attention's q/k/v/o projections
and, where named, to the dense SwiGLU FFN's gate/up/down, chosen by
model.attention.adapter ('none' or a registered name).

    y = W x + adapter(x)        for each projection the adapter's settings name

The base projection keeps its parameter names (so an imported checkpoint loads
unchanged); the adapter's parameters live beside them, under the attention's or the
FFN's `adapter` attribute (blocks/0/attn/adapter/q/..., blocks/0/ffn/adapter/up/...).
FFN projections adapt every block whose FFN is the dense SwiGLU (not the MoE layers').
train.trainable='adapter' trains those and nothing else, 'adapter_router' only their
routers (moejax/train/optimizer.py TRAINED_PATHS).

An adapter is registered with `PROJECTION_ADAPTERS.add(name, ProjectionAdapterSpec(...))`;
its settings live in model.attention.<name> (defaults declared in its spec, unknown
keys refused), and its module's call is `(x [B, L, d_in], token_mask [B, L] or None)
-> (term [B, L, d_out], aux)`, aux = {"aux_loss": weighted float32 scalar, ...}.
Grouped-query attention only (model.attention.kind='gqa').
"""

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp
import ml_collections
from flax import nnx

from moejax.adapters.base import NO_ADAPTER, refuse_unknown_settings
from moejax.errors import ConfigError, choice_error
from moejax.registry import Registry, settings_of

ADAPTER_ATTRIBUTE = "adapter"  # the attention's attribute holding the adapter modules
ATTENTION_PROJECTIONS = ("q", "k", "v", "o")
FFN_PROJECTIONS = ("gate", "up", "down")  # the dense SwiGLU's (layers/dense.py)
PROJECTIONS = ATTENTION_PROJECTIONS + FFN_PROJECTIONS
TRAINABLE = ("adapter", "adapter_router")  # the train.trainable values that need one


@dataclasses.dataclass(frozen=True)
class ProjectionAdapterSpec:
  """build(d_in, d_out, axes, settings, model_cfg, rngs=, dtype=) -> the module of one
  projection (call as in the module doc); settings ((key, default), ...) in
  model.attention.<name>, with a 'projections' setting ('q,k,v,o' or a subset);
  validate(settings, model_cfg) -> None or a ConfigError naming the key."""

  build: Callable[..., Any]
  settings: tuple[tuple[str, Any], ...]
  validate: Callable[[dict, Any], None] | None = None


PROJECTION_ADAPTERS: Registry[ProjectionAdapterSpec] = Registry("model.attention.adapter")


def adapter_name(m) -> str:
  return m.attention.get("adapter", NO_ADAPTER)


def adapter_settings(m, name: str) -> dict:
  """Adapter `name`'s settings: model.attention.<name> over its declared defaults."""
  return settings_of(m.attention, name, PROJECTION_ADAPTERS.get(name).settings)


def adapted_projections(settings: dict) -> list[str]:
  return [p.strip() for p in str(settings["projections"]).split(",") if p.strip()]


def projection_dims(m) -> dict[str, tuple[int, int]]:
  """(d_in, d_out) of every projection an adapter can name."""
  q_dim, kv_dim = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
  return {
    "q": (m.d_model, q_dim),
    "k": (m.d_model, kv_dim),
    "v": (m.d_model, kv_dim),
    "o": (q_dim, m.d_model),
    "gate": (m.d_model, m.d_ff),
    "up": (m.d_model, m.d_ff),
    "down": (m.d_ff, m.d_model),
  }


def add_adapter_sections(attention) -> None:
  """model.attention.adapter and every adapter's section at its defaults (config.py)."""
  attention.adapter = NO_ADAPTER
  for name, spec in PROJECTION_ADAPTERS.items():
    attention[name] = ml_collections.ConfigDict(dict(spec.settings))


def build_projection_adapters(m, shapes: dict, *, rngs: nnx.Rngs, dtype):
  """nnx.Dict {projection: module} of the adapter model.attention chooses, for the
  projections its settings name among those of `shapes` {projection: (d_in, d_out,
  logical axes)} (one module's: the attention's or the FFN's). nnx.data(None) when
  there is no adapter or it names none of them."""
  name = adapter_name(m)
  if name == NO_ADAPTER:
    return nnx.data(None)
  spec, settings = PROJECTION_ADAPTERS.get(name), adapter_settings(m, name)
  chosen = [p for p in adapted_projections(settings) if p in shapes]
  if not chosen:
    return nnx.data(None)
  return nnx.Dict({p: spec.build(*shapes[p], settings, m, rngs=rngs, dtype=dtype) for p in chosen})


class Projector:
  """Calls an attention's projections with its adapter's term added, and collects
  each adapted projection's aux (one per call of the attention)."""

  def __init__(self, adapter, token_mask_BxL=None):
    self.adapter, self.token_mask, self.outputs = adapter, token_mask_BxL, {}

  def __call__(self, name: str, projection, x_BxLxD):
    y = projection(x_BxLxD)
    if self.adapter is None or name not in self.adapter:
      return y
    term, self.outputs[name] = self.adapter[name](x_BxLxD, self.token_mask)
    return y + term.astype(y.dtype)

  def aux(self) -> dict | None:
    """{"aux_loss": the sum over projections, "projections": {name: its aux}}; None
    without an adapter."""
    if not self.outputs:
      return None
    total = sum((a["aux_loss"] for a in self.outputs.values()), jnp.zeros((), jnp.float32))
    return {"aux_loss": total, "projections": self.outputs}


def merged_aux(*auxes) -> dict | None:
  """One block's adapter aux from its modules' (the attention's, the FFN's; None for a
  module without an adapter): losses summed, projections side by side."""
  given = [a for a in auxes if a is not None]
  if not given:
    return None
  total = sum((a["aux_loss"] for a in given), jnp.zeros((), jnp.float32))
  return {
    "aux_loss": total,
    "projections": {k: v for a in given for k, v in a["projections"].items()},
  }


def validate_projection_adapter(m) -> None:
  """ConfigError naming the key for a bad model.attention adapter (see module doc)."""
  name = adapter_name(m)
  if name != NO_ADAPTER and name not in PROJECTION_ADAPTERS:
    raise choice_error("model.attention.adapter", name, [NO_ADAPTER, *PROJECTION_ADAPTERS])
  refuse_unknown_settings(m.attention, PROJECTION_ADAPTERS, "model.attention")
  if name == NO_ADAPTER:
    return
  if m.attention.kind != "gqa":
    raise ConfigError(
      f"model.attention.adapter={name!r} adapts grouped-query attention's projections; "
      f"model.attention.kind={m.attention.kind!r} is not supported"
    )
  settings = adapter_settings(m, name)
  chosen = adapted_projections(settings)
  if not chosen or len(set(chosen)) != len(chosen) or set(chosen) - set(PROJECTIONS):
    raise ConfigError(
      f"model.attention.{name}.projections={settings['projections']!r} must name "
      f"distinct projections among {','.join(PROJECTIONS)}"
    )
  spec = PROJECTION_ADAPTERS.get(name)
  if spec.validate is not None:
    spec.validate(settings, m)


def check_adapted_ffn(m, dense_ffn_blocks: int) -> None:
  """ConfigError when the adapter names FFN projections and no block has a dense FFN
  (dense_ffn_blocks: how many do). Checked on the model that trains: the config's own,
  or, with init.hf_dir, the directory's (moejax/train/init_from.py)."""
  name = adapter_name(m)
  if name == NO_ADAPTER or dense_ffn_blocks:
    return
  settings = adapter_settings(m, name)
  if set(adapted_projections(settings)) & set(FFN_PROJECTIONS):
    raise ConfigError(
      f"model.attention.{name}.projections={settings['projections']!r} names FFN "
      "projections, but every block's FFN is an MoE layer: they adapt the dense SwiGLU "
      "(model.ffn_type='dense', or dense layers beside the MoE ones)"
    )


def validate_adapter_training(c) -> None:
  """train.trainable 'adapter'/'adapter_router' need an adapter; adapter losses are
  per call, so micro-batches with train.balance_statistics='step' are refused."""
  name = adapter_name(c.model)
  if name == NO_ADAPTER:
    if c.train.get("trainable") in TRAINABLE:
      raise ConfigError(
        f"train.trainable={c.train.trainable!r} trains an attention adapter: set "
        "model.attention.adapter"
      )
    return
  weights = adapter_settings(c.model, name).get("loss_weights") or {}
  weighted = sorted(k for k, w in dict(weights).items() if w > 0)
  if weighted and c.train.micro_batches > 1 and c.train.balance_statistics == "step":
    raise ConfigError(
      f"train.micro_batches={c.train.micro_batches} with train.balance_statistics='step' "
      f"is not supported with model.attention.{name}.loss_weights {weighted}: the "
      "adapter's losses use each call's tokens (train.balance_statistics='micro_batch' "
      "accepts it)"
    )


def without_adapter(m) -> ml_collections.ConfigDict:
  """A copy of model config `m` with no adapter: the pretrained checkpoint's shapes."""
  out = ml_collections.ConfigDict(m.to_dict())
  out.attention.adapter = NO_ADAPTER
  return out


def carry_adapter(source, config_model) -> None:
  """Put config_model's adapter choice and sections into `source` (a model section read
  from a pretrained directory, moejax/train/init_from.py): how to adapt, not what the
  checkpoint computes."""
  source.attention.adapter = adapter_name(config_model)
  for name, _ in PROJECTION_ADAPTERS.items():
    if config_model.attention.get(name) is not None:
      source.attention[name] = ml_collections.ConfigDict(config_model.attention[name].to_dict())


def is_adapter_path(path) -> bool:
  """Whether a parameter path (keys) lies in an attention adapter."""
  return ADAPTER_ATTRIBUTE in [str(key) for key in path]


def with_adapter_params(pretrained: dict, fresh: dict) -> dict:
  """`pretrained` params (a checkpoint without the adapter) plus the adapter parameters
  of `fresh`, a new model's with the adapter (B = 0: the pretrained model exactly)."""
  flat = dict(nnx.traversals.flatten_mapping(pretrained))
  for path, value in nnx.traversals.flatten_mapping(fresh).items():
    if path not in flat and is_adapter_path(path):
      flat[path] = value
  return nnx.traversals.unflatten_mapping(flat)
