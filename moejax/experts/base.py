"""Expert types, registered by name (`model.moe.experts`), and the bound form
every dispatch backend receives.

An expert type (`ExpertType`) declares everything dispatch needs, so no
backend knows any type by name or identity:

  build(num_experts, d_model, cfg, *, rngs) -> nnx.Module
      The parameters of E experts. The module's `weights(dtype)` returns the
      dict the functions below take, every array expert-major [E, ...]; `cfg`
      is the layer's MoE ConfigDict (e.g. SwiGLU reads expert_d_ff).
  logical_axes: {weight name: logical axes of that weight}
      First axis 'expert'. Expert parallelism (dispatch/expert_parallel.py)
      shards the weights by these; the module's nnx.Params carry the same.
  expert(weights_e, x, **options) -> y
      ONE expert on rows x [n, d] -> [n, d], with weights_e = {name: w[e]}.
      Plain jnp, no grouped matmul: this *defines* the type; the contract
      tests (tests/contract/) compare every backend with a per-token loop of it.
  apply(weights, rows, matmul, **options) -> out
      The same function on rows grouped by expert, written against a grouped
      matmul `matmul(rows [R, a], w [E, a, b]) -> [R, b]` that applies each
      group's own slice w[e] (a batched einsum for the capacity layout, one of
      the `model.moe.grouped_matmul` backends for dropless). Every dispatcher
      and grouped matmul runs every expert type through this.
  fused(weights, x, routing, cfg, **options) -> (y [T, d], metrics), or None
      The type's own whole-layer path (gather, experts, weighted combine),
      when it has one: dispatch 'dropless_memeff' and grouped_matmul 'fused'
      run it, grouped_matmul 'auto' prefers it on CPU. It must compute exactly
      sum_s w[t, s] * expert(weights[e[t, s]], x[t]) over valid slots, with
      the gradients of that sum (x, weights, combine weights).
  gathered(weights, rows, row_expert, **options) -> out, or None
      The type's own form for the 'gather' grouped matmul (a decode step's few
      rows): the expert function on rows [R, d], row r through expert
      row_expert[r], reading only those experts' weights (compressed types:
      experts/gathered.py). None: apply with a matmul gathering w[row_expert].
  code_levels: {weight name: levels}
      Weights that carry integer codes as exact floats (compressed types), with
      how many levels they take at the default settings: the contract tests
      draw them as integers in [0, levels).
  settings: {key: default}
      The type's own settings; the config holds them in the section
      model.moe.<name> (built from this registry, see config.base_config).
      `parse(cfg)` reads them once (a frozen registry.Settings, defaults where
      absent) and `bind` passes them to expert/apply/fused as keyword arguments.
  validate(section) -> None: ConfigError for bad settings (optional).

A new kind of expert (LoRA, quantized, pruned, ...) is one file here calling
`register_expert_type` (the package imports every module); the contract tests then run
it through every dispatcher and grouped matmul without a test edit.

Bound experts. Dispatchers take `expert_fn(rows, matmul)`; the MoE layer
passes `BoundExperts` (type + weights + options: the settings it parsed once,
where it was built), which is such a callable
and also carries the fused path. For older callers,
`functools.partial(<registered apply>, weights, **options)` is recognised
too (`experts_of`), looked up in the registry, not by identity with any one
type.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax

from moejax.errors import ConfigError
from moejax.registry import PartSettings, Registry, Settings

GroupedMatmul = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity (static in nnx graphs)
class ExpertType:
  """A registered expert type (see module doc for each field's contract)."""

  name: str
  build: Callable[..., Any]
  logical_axes: Mapping[str, tuple]
  expert: Callable[..., jax.Array]
  apply: Callable[..., jax.Array]
  fused: Callable[..., tuple[jax.Array, dict]] | None = None
  gathered: Callable[..., jax.Array] | None = None
  code_levels: Mapping[str, int] = dataclasses.field(default_factory=dict)
  settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  validate: Callable[[Any], None] | None = None

  @property
  def config_section(self) -> PartSettings:
    """Its settings section, model.moe.<name> (`validate` gets the section itself)."""
    return PartSettings(
      self.name,
      f"expert type {self.name!r}",
      tuple(self.settings.items()),
      validate=self._validate_section,
    )

  def parse(self, cfg=None) -> Settings:
    """This type's settings from model.moe.<name> of `cfg`, a model.moe ConfigDict
    (defaults where absent or for None), frozen."""
    return self.config_section.parse(cfg)

  def bind(self, weights: dict, cfg=None, **options) -> "BoundExperts":
    """These experts with their weights; options parsed from `cfg` (a model.moe
    ConfigDict, or this type's Settings already parsed), overridden by keywords."""
    unknown = set(options) - set(self.settings)
    if unknown:
      raise TypeError(
        f"expert type {self.name!r} has no settings {sorted(unknown)}; "
        f"its settings: {sorted(self.settings)}"
      )
    parsed = cfg if isinstance(cfg, Settings) else self.parse(cfg)
    return BoundExperts(self, weights, Settings({**parsed, **options}))

  def validate_settings(self, moe_cfg) -> None:
    """Check model.moe.<name> (ConfigError naming the key)."""
    self.config_section.check(moe_cfg)

  def _validate_section(self, moe_cfg) -> None:
    section = moe_cfg.get(self.name)
    if self.validate is not None and section is not None:
      self.validate(section)


@dataclasses.dataclass(frozen=True, eq=False)
class BoundExperts:
  """An expert type with its weights and options: the `expert_fn` of dispatch."""

  type: ExpertType
  weights: dict
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __call__(self, rows: jax.Array, matmul: GroupedMatmul) -> jax.Array:
    return self.type.apply(self.weights, rows, matmul, **self.options)

  @property
  def apply(self) -> Callable[..., jax.Array]:
    """apply(weights, rows, matmul) with this binding's options (expert parallelism
    binds its local weight shards to it)."""
    return functools.partial(self.type.apply, **self.options)

  @property
  def has_fused(self) -> bool:
    return self.type.fused is not None

  def fused(self, x, routing, cfg) -> tuple[jax.Array, dict]:
    if self.type.fused is None:
      raise ConfigError(f"expert type {self.type.name!r} declares no fused path")
    return self.type.fused(self.weights, x, routing, cfg, **self.options)

  @property
  def has_gathered(self) -> bool:
    return self.type.gathered is not None

  def gathered(self, rows, row_expert) -> jax.Array:
    """The type's own 'gather' form: row r through expert row_expert[r]."""
    if self.type.gathered is None:
      raise ConfigError(f"expert type {self.type.name!r} declares no gathered form")
    return self.type.gathered(self.weights, rows, row_expert, **self.options)

  def with_weights(self, weights: dict) -> "BoundExperts":
    return dataclasses.replace(self, weights=weights)


EXPERT_TYPES: Registry[ExpertType] = Registry("model.moe.experts")
get_expert_type = EXPERT_TYPES.get


def register_expert_type(spec: ExpertType) -> ExpertType:
  """Register `spec` under spec.name (its settings become model.moe.<name>)."""
  return EXPERT_TYPES.add(spec.name, spec)


def experts_of(expert_fn) -> BoundExperts | None:
  """`expert_fn` as BoundExperts: itself, or a (nested) functools.partial of a
  registered type's `apply` with the weights as its one positional argument;
  None for any other callable (it can still run through every grouped
  matmul, but has no fused path)."""
  if isinstance(expert_fn, BoundExperts):
    return expert_fn
  if not isinstance(expert_fn, functools.partial):
    return None
  func, args, keywords = expert_fn.func, tuple(expert_fn.args), dict(expert_fn.keywords)
  while isinstance(func, functools.partial):
    inner = func
    func, args, keywords = inner.func, tuple(inner.args) + args, {**inner.keywords, **keywords}
  if len(args) != 1:
    return None
  for _, spec in EXPERT_TYPES.items():
    if spec.apply is func and set(keywords) <= set(spec.settings):
      return BoundExperts(spec, args[0], Settings({**spec.parse(), **keywords}))
  return None
