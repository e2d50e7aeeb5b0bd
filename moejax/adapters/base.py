"""The prompt-adapter registry and the one way prompts enter the ViT's sequence.

A prompt adapter (VPT, Jia et al. 2022; VAPT, arXiv 2501.18936) puts N tokens in
slots right after the CLS token (at the front where pooling is 'mean'), without
position embeddings:

    block 0 input:  [CLS, P_0, patches]       the slots inserted (place_prompts)
    block i input:  [CLS, P_i, patches_i]     P_i = the adapter's tokens for block i,
                                              or the previous block's slot outputs
                                              where the adapter gives none
    after the last block the slots are dropped (drop_prompts) before the final norm
    and the pooling, so CLS or the patch mean pools as without prompts.

An adapter is an nnx.Module with `num_tokens` and `__call__(layer, patches_BxPxD)`
returning [B, N, d] prompts for block `layer` or None (keep the slots). One whose
prompts are key/value prefixes inside the attention (SMoPE) has num_tokens 0 and an
`attention_prefix(layer, train, losses)` method giving block `layer`'s hook (or None),
which appends its weighted losses to the list `losses` (the model adds them to aux_loss). Its
settings live in model.vit.prompt.<name> (defaults declared in its AdapterSpec,
unknown keys refused); model.vit.prompt.num_tokens is N for every adapter.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError, choice_error
from moejax.registry import Registry

NO_ADAPTER = "none"
COMMON_KEYS = ("adapter", "num_tokens")


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
  """build(model_cfg, settings, rngs) -> the adapter module. settings: ((key, default),
  ...) in model.vit.prompt.<name>. validate(settings, model_cfg) -> None or a
  ConfigError naming the key. per_block: the adapter writes the slots of blocks
  after the first, so the blocks run one by one (model.scan_layers=False)."""

  build: Callable[..., Any]
  settings: tuple[tuple[str, Any], ...] = ()
  validate: Callable[[dict, Any], None] | None = None
  per_block: bool = False


ADAPTERS: Registry[AdapterSpec] = Registry("model.vit.prompt.adapter")


def prompt_section(m):
  """model.vit.prompt, or None for a config without one (no adapter)."""
  return m.vit.get("prompt")


def adapter_name(m) -> str:
  section = prompt_section(m)
  return NO_ADAPTER if section is None else section.adapter


def settings_of(m, name: str) -> dict:
  """Adapter `name`'s settings: model.vit.prompt.<name> over its declared defaults."""
  section = prompt_section(m)
  own = None if section is None else section.get(name)
  return {
    key: default if own is None else own.get(key, default)
    for key, default in ADAPTERS.get(name).settings
  }


def build_adapter(m, *, rngs):
  """The adapter module model.vit.prompt chooses, or None."""
  name = adapter_name(m)
  if name == NO_ADAPTER:
    return None
  return ADAPTERS.get(name).build(m, settings_of(m, name), rngs)


def refuse_unknown_settings(parent, registry, prefix: str) -> None:
  """ConfigError for a key that adapter `name`'s spec does not declare in its section
  parent.<name> (`prefix`.<name>), for every adapter of `registry`."""
  for other, spec in registry.items():
    own = parent.get(other)
    extra = sorted(set(own if own is not None else ()) - {k for k, _ in spec.settings})
    if extra:
      raise ConfigError(
        f"{prefix}.{other} has unknown keys {extra}; adapter "
        f"{other!r} has settings {sorted(k for k, _ in spec.settings)}"
      )


def validate_prompt(c) -> None:
  """ConfigError naming the key for a bad model.vit.prompt (unknown adapter or key, a
  bad value, a per-block adapter with scanned layers, train.trainable='prompt'
  without an adapter)."""
  m, section = c.model, prompt_section(c.model)
  name = adapter_name(m)
  if section is not None:
    allowed = set(COMMON_KEYS) | {n for n, _ in ADAPTERS.items()}
    unknown = sorted(set(section) - allowed)
    if unknown:
      raise ConfigError(f"model.vit.prompt has unknown keys {unknown}; it has {sorted(allowed)}")
    if name != NO_ADAPTER and name not in ADAPTERS:
      raise choice_error("model.vit.prompt.adapter", name, [NO_ADAPTER, *ADAPTERS])
    n = section.num_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise ConfigError(f"model.vit.prompt.num_tokens={n!r} must be an int >= 1")
    refuse_unknown_settings(section, ADAPTERS, "model.vit.prompt")
  if name == NO_ADAPTER:
    if c.train.get("trainable") == "prompt":
      raise ConfigError(
        "train.trainable='prompt' trains a prompt adapter: set model.vit.prompt.adapter"
      )
    return
  spec = ADAPTERS.get(name)
  if spec.per_block and m.scan_layers:
    raise ConfigError(
      f"model.vit.prompt.adapter={name!r} writes every block's prompts: set model.scan_layers=False"
    )
  if spec.validate is not None:
    spec.validate(settings_of(m, name), m)


def place_prompts(adapter, layer: int, x_BxLxD, num_prefix: int):
  """Block `layer`'s input with the adapter's prompts in the slots after the first
  `num_prefix` tokens (the CLS token): inserted at block 0, replaced after it."""
  n = adapter.num_tokens
  patches = x_BxLxD[:, num_prefix + (n if layer > 0 else 0) :]
  prompts = adapter(layer, patches)
  if prompts is None:
    return x_BxLxD
  return jnp.concatenate([x_BxLxD[:, :num_prefix], prompts.astype(x_BxLxD.dtype), patches], axis=1)


def attention_prefix(adapter, layer: int, train: bool, losses: list | None = None):
  """Block `layer`'s key/value prefix hook (layers/attention.py prefixed_attention) from
  an adapter whose prompts live inside the attention (SMoPE), or None. The hook appends
  the adapter's weighted losses of that block (traced scalars) to `losses`."""
  hook = getattr(adapter, "attention_prefix", None)
  return None if hook is None else hook(layer, train, losses)


def drop_prompts(adapter, x_BxLxD, num_prefix: int):
  """The sequence without its prompt slots (before the final norm and the pooling)."""
  return jnp.concatenate(
    [x_BxLxD[:, :num_prefix], x_BxLxD[:, num_prefix + adapter.num_tokens :]], axis=1
  )


def xavier_uniform(key, shape, fan_in: int, fan_out: int):
  """VPT's prompt initialisation: U(-a, a), a = sqrt(6 / (fan_in + fan_out)), with fan_in
  the pixels of one patch (P * P * C) and fan_out the width (Jia et al. 2022, sec. 3.2)."""
  bound = (6.0 / (fan_in + fan_out)) ** 0.5
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound)
