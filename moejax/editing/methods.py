"""Edit methods by name (`--method`), each with its declared settings, parsed and
checked once (`EditMethod.bind`), as expert types bind theirs.

  moe_edit  MoEEdit (arXiv 2602.10965): per layer, randomised BCD over the routed
            experts (editing/bcd.py), each update projected into the null space
            of the expert's preserved keys (editing/nullspace.py); project=False
            is the ablation without P_j.
  lstsq     the baseline: each routed expert's own ridge least squares, no
            projection, no coupling (bcd.per_expert_lstsq).
  finetune  the baseline: Adam on the edited layers' expert down projections,
            on the edit's NLL (editing/edit.py).

Every method edits the MoE blocks `layers` (block indices); the closed-form ones
spread each edit's target over them as MEMIT does (editing/edit.py). Settings
shared by all: COMMON.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

from moejax.errors import ConfigError
from moejax.registry import Registry

COMMON = {
  "layers": (1, 2),
  "key_position": "continuation",
  "target_steps": 15,
  "target_lr": 0.5,
  "target_decay": 0.5,
  "clamp": 4.0,
}


@dataclasses.dataclass(frozen=True, eq=False)
class EditMethod:
  """kind 'layer': solve(R, gates, keys, projectors, options) -> deltas [E, d, f],
  with needs_projectors saying whether it reads preserved keys; kind 'gradient':
  trains (editing/edit.py). settings: its own defaults, beside COMMON."""

  name: str
  kind: str
  settings: Mapping[str, Any]
  solve: Callable | None = None
  needs_projectors: bool = False

  @property
  def defaults(self) -> dict:
    return {**COMMON, **self.settings}

  def bind(self, overrides: Mapping[str, Any] | None = None) -> "Bound":
    """The method with its settings: defaults updated by `overrides`, each key known
    and each value of its default's type and in range (ConfigError naming
    <method>.<key>=<value>)."""
    options = self.defaults
    for key, value in dict(overrides or {}).items():
      if key not in options:
        raise ConfigError(
          f"edit method {self.name!r} has no setting {key}={value!r}; settings: "
          f"{', '.join(sorted(options))}"
        )
      options[key] = _typed(self.name, key, value, options[key])
    for key, value in options.items():
      _check(self.name, key, value)
    return Bound(self, options)


@dataclasses.dataclass(frozen=True)
class Bound:
  method: EditMethod
  options: dict


def _typed(name: str, key: str, value, default):
  where = f"{name}.{key}={value!r}"
  if isinstance(default, bool):
    if not isinstance(value, bool):
      raise ConfigError(f"{where} must be true or false")
    return value
  if isinstance(default, tuple):
    try:
      return tuple(int(v) for v in value)
    except (TypeError, ValueError):
      raise ConfigError(f"{where} must be a list of block indices") from None
  if isinstance(default, (int, float)) and (
    isinstance(value, bool) or not isinstance(value, (int, float))
  ):
    raise ConfigError(f"{where} must be a number")
  if isinstance(default, int) and not isinstance(default, bool) and value != int(value):
    raise ConfigError(f"{where} must be an integer")
  return type(default)(value)


POSITIVE = ("target_lr", "clamp", "lr")
AT_LEAST_ONE = ("target_steps", "passes", "steps")


def _check(name: str, key: str, value) -> None:
  where = f"{name}.{key}={value!r}"
  if isinstance(value, float) and not math.isfinite(value):
    raise ConfigError(f"{where} must be finite")
  if key in POSITIVE and not value > 0:
    raise ConfigError(f"{where} must be > 0")
  if key in AT_LEAST_ONE and value < 1:
    raise ConfigError(f"{where} must be >= 1")
  if key in ("lam", "target_decay", "seed") and value < 0:
    raise ConfigError(f"{where} must be >= 0")
  if key == "tol" and not 0 <= value < 1:
    raise ConfigError(f"{where} must lie in [0, 1)")
  if key == "layers" and (not value or list(value) != sorted(set(value)) or value[0] < 0):
    raise ConfigError(f"{where} must be increasing block indices >= 0")
  if key == "key_position":
    from moejax.editing.capture import KEY_POSITIONS

    if value not in KEY_POSITIONS:
      raise ConfigError(f"{where}; valid: {', '.join(KEY_POSITIONS)}")


EDIT_METHODS: Registry[EditMethod] = Registry("--method")


def register_edit_method(method: EditMethod) -> EditMethod:
  return EDIT_METHODS.add(method.name, method)


def get(name: str) -> EditMethod:
  return EDIT_METHODS.get(name)


def _moe_edit(R, gates, keys, projectors, options):
  from moejax.editing import bcd

  return bcd.bcd_edit(
    R,
    gates,
    keys,
    lam=options["lam"],
    passes=options["passes"],
    seed=options["seed"],
    projectors=projectors,
  )


def _lstsq(R, gates, keys, projectors, options):
  from moejax.editing import bcd

  return bcd.per_expert_lstsq(R, gates, keys, lam=options["lam"])


register_edit_method(
  EditMethod(
    "moe_edit",
    "layer",
    {"lam": 1.0, "tol": 1e-2, "passes": 2, "project": True, "seed": 0, "check_capacity": True},
    _moe_edit,
    needs_projectors=True,
  )
)
register_edit_method(EditMethod("lstsq", "layer", {"lam": 1.0}, _lstsq))
register_edit_method(EditMethod("finetune", "gradient", {"steps": 10, "lr": 1e-3}))


def default_layers(m) -> tuple[int, ...]:
  """The early-middle MoE blocks MEMIT-style edits target: those in [1, L/2) of an
  L-block model, or its last MoE block when none lies there (a 2-block model)."""
  from moejax.models.structure import moe_layer_indices

  moe = list(moe_layer_indices(m))
  return tuple(b for b in moe if 1 <= b < m.num_layers // 2) or (moe[-1],)


def with_model_layers(bound: Bound, m, *, given: bool) -> Bound:
  """`bound` with the default `layers` replaced by the model's `default_layers` where
  the default names a block the model lacks; layers the user gave stay as given."""
  from moejax.models.structure import moe_layer_indices

  moe = set(moe_layer_indices(m))
  if given or set(bound.options["layers"]) <= moe:
    return bound
  return Bound(bound.method, {**bound.options, "layers": default_layers(m)})


def check_model(bound: Bound, m) -> None:
  """ConfigError unless every edited layer is an MoE block of 'swiglu' experts of
  the model config `m` (loop or scanned layout)."""
  from moejax.models.structure import moe_layer_indices

  layers, moe = bound.options["layers"], moe_layer_indices(m)
  name = bound.method.name
  for block in layers:
    if block not in moe:
      raise ConfigError(
        f"{name}.layers={list(layers)}: block {block} is not an MoE block of "
        f"the model (MoE blocks: {moe})"
      )
  if m.moe.get("experts", "swiglu") != "swiglu":
    raise ConfigError(
      f"edits change 'swiglu' experts' down projections; the model has {m.moe.experts!r} experts"
    )
