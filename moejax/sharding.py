"""The device mesh and the logical-axis rules: the one place that maps names to devices.

Mesh (GSPMD, Xu et al. 2021; the MaxText layout). Four named axes, sizes from
the `mesh` config section, -1 meaning "all the devices the others leave":
  data    pure data parallelism: batch split, parameters replicated
  fsdp    ZeRO-3 / FSDP: batch split *and* parameters + optimizer state split
          on their `embed` dimension (XLA all-gathers them where used)
  expert  expert parallelism: experts split; tokens also split (a batch axis
          outside the MoE layers), exchanged by all_to_all inside them
  tensor  Megatron tensor parallelism: heads, FFN width and vocab split
Axes are Auto (XLA propagates shardings); `with_sharding_constraint` pins the
main activations.

Logical axes (MaxText's logical_axis_rules). Every parameter carries the
names of its dimensions as `nnx.Param(..., logical_axes=(...))` metadata and
the main activations are constrained by name (`constrain`). RULES maps each
name to the mesh axes it is split over; `sharding.rules.<name>` in the config
overrides one entry ("data,fsdp" or "" for replicated). A dimension whose
size the mesh axes do not divide stays replicated, and a mesh axis already
used by an earlier dimension of the same array is skipped.

With one device there is no Layout: nothing here runs, and the model is the
plain single-device program.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Iterator, Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from moejax.errors import ConfigError, choice_error

MESH_AXES = ("data", "fsdp", "expert", "tensor")

# logical axis -> mesh axes it is split over (in this order).
RULES: dict[str, tuple[str, ...]] = {
  # activations
  "batch": ("data", "fsdp", "expert"),
  "length": (),
  "act_embed": (),
  "act_vocab": ("tensor",),
  # parameters
  "vocab": ("tensor",),
  "embed": ("fsdp",),
  "heads": ("tensor",),  # query heads x head_dim (q out, o in)
  "kv_heads": ("tensor",),  # key/value heads x head_dim; set "" if num_kv_heads < tensor
  "mlp": ("tensor",),  # dense and expert FFN width
  "expert": ("expert",),
  # L3 key/value table rows (moejax/layers/lookup.py): replicated, kept out of
  # the dense params' FSDP split (a host-offload candidate, see that module).
  "lookup_rows": (),
}
ALL_TO_ALLS = ("auto", "ragged", "fixed")


def rules_as_strings() -> dict[str, str]:
  """RULES in the config's string form ("data,fsdp,expert"; "" = replicated)."""
  return {name: ",".join(axes) for name, axes in RULES.items()}


def parse_rules(rules: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
  """The `sharding.rules` config section over RULES, checked name by name."""
  out = dict(RULES)
  for name, value in rules.items():
    if name not in RULES:
      raise choice_error(f"sharding.rules.{name} (logical axis)", name, RULES)
    axes = tuple(a.strip() for a in str(value or "").split(",") if a.strip())
    for axis in axes:
      if axis not in MESH_AXES:
        raise ConfigError(
          f"sharding.rules.{name}={value!r}: {axis!r} is not a mesh axis; "
          f"mesh axes: {', '.join(MESH_AXES)}"
        )
    out[name] = axes
  if not set(out["expert"]) <= set(out["batch"]):
    raise ConfigError(
      f"sharding.rules.expert={','.join(out['expert'])!r} must be among the "
      f"batch axes (sharding.rules.batch={','.join(out['batch'])!r}): tokens "
      "are split over the expert axes outside the MoE layers"
    )
  for token_rule in ("batch", "expert"):
    shared = set(out[token_rule]) & set(out["mlp"])
    if shared:
      raise ConfigError(
        f"sharding.rules.mlp={','.join(out['mlp'])!r} shares mesh axes "
        f"{sorted(shared)} with sharding.rules.{token_rule}; the expert "
        "FFN width must be split over axes that hold the same tokens"
      )
  return out


def validate_sharding_config(c) -> None:
  """Checks that need no devices: axis sizes, rule names, the all_to_all kind."""
  for axis in MESH_AXES:
    size = c.mesh[axis]
    if not isinstance(size, int) or isinstance(size, bool) or not (size >= 1 or size == -1):
      raise ConfigError(f"mesh.{axis}={size!r} must be an int >= 1, or -1 for the rest")
  rest = [a for a in MESH_AXES if c.mesh[a] == -1]
  if len(rest) > 1:
    raise ConfigError(f"mesh.{rest[0]}=-1 and mesh.{rest[1]}=-1: at most one axis may be -1")
  parse_rules(c.sharding.rules)
  if c.sharding.all_to_all not in ALL_TO_ALLS:
    raise choice_error("sharding.all_to_all", c.sharding.all_to_all, ALL_TO_ALLS)
  if c.sharding.a2a_capacity_factor < 0:
    raise ConfigError(
      f"sharding.a2a_capacity_factor={c.sharding.a2a_capacity_factor} "
      "must be >= 0 (0: a buffer that never overflows)"
    )


def mesh_shape(mesh_cfg, num_devices: int) -> dict[str, int]:
  """Axis sizes with -1 resolved; ConfigError when they do not tile the devices."""
  sizes = {a: mesh_cfg[a] for a in MESH_AXES}
  fixed = math.prod(s for s in sizes.values() if s != -1)
  described = ", ".join(f"mesh.{a}={s}" for a, s in sizes.items())
  rest = [a for a, s in sizes.items() if s == -1]
  if rest:
    if num_devices % fixed:
      raise ConfigError(
        f"mesh.{rest[0]}=-1 cannot fill the {num_devices} devices: the other "
        f"axes ({described}) multiply to {fixed}, which does not divide it"
      )
    sizes[rest[0]] = num_devices // fixed
  elif fixed != num_devices:
    raise ConfigError(
      f"the mesh ({described}) has {fixed} devices but {num_devices} are "
      "available; make the product match or set one axis to -1"
    )
  return sizes


@dataclasses.dataclass(frozen=True)
class Layout:
  """A mesh plus the rules that place logical axes on it, and the EP settings."""

  mesh: Mesh
  rules: Mapping[str, tuple[str, ...]]
  all_to_all: str = "fixed"  # 'ragged' | 'fixed' (resolved from 'auto')
  a2a_capacity_factor: float = 0.0

  def mesh_axes(self, logical: str | None) -> tuple[str, ...]:
    return () if logical is None else tuple(self.rules[logical])

  def size(self, mesh_axes: Sequence[str]) -> int:
    return math.prod(self.mesh.shape[a] for a in mesh_axes)

  def spec(self, logical_axes: Sequence[str | None], shape: Sequence[int] | None = None) -> P:
    """PartitionSpec for an array with these logical axes (see module doc)."""
    used: set[str] = set()
    dims = []
    for i, name in enumerate(logical_axes):
      axes = tuple(a for a in self.mesh_axes(name) if a not in used)
      if shape is not None and shape[i] % self.size(axes):
        axes = ()
      used.update(axes)
      dims.append(axes[0] if len(axes) == 1 else (axes or None))
    return P(*dims)

  def named(self, logical_axes, shape=None) -> NamedSharding:
    return NamedSharding(self.mesh, self.spec(logical_axes, shape))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())


def make_mesh(sizes: Mapping[str, int], devices=None) -> Mesh:
  """A mesh over `devices` (default: all), axes in MESH_AXES order, Auto axis types."""
  shape = tuple(sizes[a] for a in MESH_AXES)
  return jax.make_mesh(
    shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
  )


def make_layout(config, devices=None) -> Layout | None:
  """The Layout for `config` on `devices` (default: all), or None on one device.

  Raises ConfigError, before anything is compiled, when the mesh does not tile
  the devices, the experts or the batch do not split over their axes, or a
  rule names an unknown axis.
  """
  validate_sharding_config(config)
  devices = jax.devices() if devices is None else list(devices)
  sizes = mesh_shape(config.mesh, len(devices))
  rules = parse_rules(config.sharding.rules)
  if len(devices) == 1:
    return None
  expert_size = math.prod(sizes[a] for a in rules["expert"])
  num_experts = config.model.moe.num_experts
  if config.model.ffn_type == "moe" and num_experts % expert_size:
    raise ConfigError(
      f"model.moe.num_experts={num_experts} is not divisible by the expert "
      f"axis ({'x'.join(rules['expert'])}={expert_size})"
    )
  batch_shards = math.prod(sizes[a] for a in rules["batch"])
  if config.data.batch_size % batch_shards:
    raise ConfigError(
      f"data.batch_size={config.data.batch_size} is not divisible by the "
      f"{batch_shards} batch shards (mesh axes "
      f"{'x'.join(rules['batch'])} = "
      f"{'x'.join(str(sizes[a]) for a in rules['batch'])})"
    )
  kind = config.sharding.all_to_all
  if kind == "auto":
    kind = "fixed" if devices[0].platform == "cpu" else "ragged"
  return Layout(make_mesh(sizes, devices), rules, kind, config.sharding.a2a_capacity_factor)


# The layout the model is being traced under (None: the single-device program).
_ACTIVE: list[Layout | None] = [None]


@contextlib.contextmanager
def use_layout(layout: Layout | None) -> Iterator[None]:
  """Trace the model under `layout`: constraints and expert parallelism switch on."""
  _ACTIVE.append(layout)
  try:
    yield
  finally:
    _ACTIVE.pop()


def current_layout() -> Layout | None:
  return _ACTIVE[-1]


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
  """Pin an activation's sharding by logical names; the identity without a layout."""
  layout = current_layout()
  if layout is None:
    return x
  return jax.lax.with_sharding_constraint(x, layout.named(logical_axes, x.shape))


def logical_axes_of(state: nnx.State) -> dict:
  """The pure-dict tree (as nnx.to_pure_dict) of each variable's logical axes.

  Variables without `logical_axes` metadata get all-None axes (replicated).
  """

  def axes(variable):
    names = variable.get_metadata().get("logical_axes")
    return LogicalAxes(tuple(names) if names else (None,) * variable.get_value().ndim)

  return nnx.to_pure_dict(
    jax.tree.map(lambda v: v.replace(axes(v)), state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  )


@dataclasses.dataclass(frozen=True)
class LogicalAxes:
  """A pytree leaf holding one array's logical axis names (a tuple would be a node)."""

  names: tuple


def tree_shardings(layout: Layout, axes_tree, shapes_tree):
  """NamedShardings for a tree of arrays (or ShapeDtypeStructs) from its logical axes."""
  return jax.tree.map(
    lambda axes, x: layout.named(axes.names, x.shape),
    axes_tree,
    shapes_tree,
    is_leaf=lambda x: isinstance(x, LogicalAxes),
  )
