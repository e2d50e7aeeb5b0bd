"""Logical-axis rules, mesh sizes and their errors, on this session's single device.

The rules are checked against an abstract 4-axis mesh (no devices needed);
everything that runs on 8 devices is in multidevice/ (test_on_8_devices.py)."""

import math

import jax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec as P

from moejax import sharding
from moejax.config import base_config
from moejax.validation import validate_config
from moejax.errors import ConfigError
from moejax.interop.hf_config import from_hf_config
from moejax.models import Decoder
from tests.interop.hf_tiny import FAMILY_NAMES, family_configs
from moejax.train import step as step_lib
from moejax.train.loop import train_and_evaluate


def layout(data=1, fsdp=1, expert=1, tensor=1, **rules):
  mesh = AbstractMesh((data, fsdp, expert, tensor), sharding.MESH_AXES)
  return sharding.Layout(mesh, sharding.parse_rules(rules))


@pytest.mark.parametrize(
  "axes,shape,spec",
  [
    (("expert", "embed", "mlp"), (8, 32, 64), P("expert", "fsdp", "tensor")),  # expert FFN
    (("vocab", "embed"), (256, 32), P("tensor", "fsdp")),  # embedding table
    (("embed", "heads"), (32, 64), P("fsdp", "tensor")),  # q projection
    (("embed", None), (32, 8), P("fsdp", None)),  # router kernel: experts replicated
    (("batch", "length"), (16, 128), P(("data", "fsdp", "expert"), None)),
    (("batch", "length", "act_vocab"), (16, 8, 256), P(("data", "fsdp", "expert"), None, "tensor")),
    ((None,), (32,), P(None)),  # norm scales
  ],
)
def test_rules_map_logical_axes_to_mesh_axes(axes, shape, spec):
  assert layout(data=2, fsdp=2, expert=2, tensor=2).spec(axes, shape) == spec


def test_a_dimension_the_mesh_does_not_divide_stays_replicated():
  lay = layout(fsdp=2, expert=4, tensor=2)
  assert lay.spec(("embed", "kv_heads"), (32, 15)) == P("fsdp", None)
  assert lay.spec(("batch", "length"), (4, 8)) == P(None, None)  # 4 rows, 8 shards


def test_a_mesh_axis_is_used_once_per_array():
  lay = layout(fsdp=2, expert=2, embed="fsdp,expert")
  assert lay.spec(("expert", "embed", "mlp"), (4, 32, 64)) == P("expert", "fsdp", "tensor")


@pytest.mark.parametrize("family", ("moejax",) + FAMILY_NAMES)
def test_every_parameter_of_every_family_names_its_axes(family):
  m = (
    base_config().model
    if family == "moejax"
    else from_hf_config(family_configs()[family].to_dict())
  )
  model = nnx.eval_shape(lambda: Decoder(m, rngs=nnx.Rngs(0)))
  _, params, _ = nnx.split(model, nnx.Param, ...)
  axes_tree = sharding.logical_axes_of(params)
  for axes, param in zip(jax.tree.leaves(axes_tree), jax.tree.leaves(nnx.to_pure_dict(params))):
    assert len(axes.names) == param.ndim
    assert set(axes.names) - {None} <= set(sharding.RULES)
    assert param.ndim < 2 or any(axes.names)  # every matrix is split somewhere
  moe_block = next(i for i, b in enumerate(model.blocks) if b.is_moe)
  experts = axes_tree["blocks"][moe_block]["ffn"]["experts"]
  assert experts["w_down"].names == ("expert", "mlp", "embed")


@pytest.mark.parametrize(
  "mesh,devices,sizes",
  [
    (dict(data=-1, fsdp=1, expert=1, tensor=1), 8, dict(data=8, fsdp=1, expert=1, tensor=1)),
    (dict(data=2, fsdp=1, expert=-1, tensor=1), 8, dict(data=2, fsdp=1, expert=4, tensor=1)),
    (dict(data=1, fsdp=2, expert=2, tensor=2), 8, dict(data=1, fsdp=2, expert=2, tensor=2)),
  ],
)
def test_minus_one_takes_the_remaining_devices(mesh, devices, sizes):
  assert sharding.mesh_shape(mesh, devices) == sizes


@pytest.mark.parametrize(
  "section,key,value,message",
  [
    ("mesh", "data", 0, r"mesh.data=0 must be an int >= 1, or -1 for the rest"),
    ("mesh", "expert", -1, r"mesh.data=-1 and mesh.expert=-1: at most one axis may be -1"),
    ("sharding.rules", "mlp", "tensr", r"sharding.rules.mlp='tensr': 'tensr' is not a mesh axis"),
    ("sharding.rules", "mlp", "expert", r"sharding.rules.mlp='expert' shares mesh axes"),
    (
      "sharding.rules",
      "expert",
      "tensor",
      r"sharding.rules.expert='tensor' must be among the "
      r"batch axes",
    ),
    ("sharding", "a2a_capacity_factor", -1.0, r"sharding.a2a_capacity_factor=-1.0 must be >= 0"),
  ],
)
def test_bad_sharding_config_is_rejected(section, key, value, message):
  config = base_config()
  node = config
  for part in section.split("."):
    node = node[part]
  node[key] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config)


def test_unknown_logical_axis_in_rules_is_rejected():
  with pytest.raises(ConfigError, match=r"sharding.rules.experts \(logical axis\)='experts'"):
    sharding.parse_rules({"experts": "expert"})


def test_a_mesh_bigger_than_this_machine_is_rejected_before_compilation(tmp_path, monkeypatch):
  config = base_config()
  config.mesh.data, config.mesh.expert = 2, 4
  compiled = []
  monkeypatch.setattr(step_lib, "make_train_step", lambda *a: compiled.append(a))
  with pytest.raises(ConfigError, match=r"has 8 devices but 1 are available"):
    train_and_evaluate(config, str(tmp_path), write_metrics=False)
  assert not compiled


def test_one_device_runs_the_plain_program():
  assert sharding.make_layout(base_config()) is None  # data=-1 on 1 device
  assert sharding.current_layout() is None
  x = object()
  assert sharding.constrain(x, ("batch",)) is x


# Every rule, written out (not read back from RULES), on a mesh whose axis sizes are
# distinct primes: a dimension of 210 = 2 * 3 * 5 * 7 divides by any set of axes, so
# the spec shows exactly which axes a rule names. Mapping a rule to another axis, or
# dropping one, changes the spec.
EXPECTED_RULES = {
  "batch": ("data", "fsdp", "expert"),
  "length": None,
  "act_embed": None,
  "act_vocab": "tensor",
  "vocab": "tensor",
  "embed": "fsdp",
  "heads": "tensor",
  "kv_heads": "tensor",
  "mlp": "tensor",
  "expert": "expert",
  "lookup_rows": None,
}
PRIMES = dict(data=2, fsdp=3, expert=5, tensor=7)


def test_the_rule_table_covers_every_logical_axis():
  assert set(EXPECTED_RULES) == set(sharding.RULES)


@pytest.mark.parametrize("name", sorted(EXPECTED_RULES))
def test_every_rule_at_a_divisible_shape(name):
  lay = layout(**PRIMES)
  assert lay.spec((name,), (210,)) == P(EXPECTED_RULES[name])
  assert lay.spec((name,)) == P(EXPECTED_RULES[name])  # no shape: no divisibility check
  # the same rule as the second dimension, after a replicated one
  assert lay.spec((None, name), (4, 210)) == P(None, EXPECTED_RULES[name])


@pytest.mark.parametrize("name", sorted(EXPECTED_RULES))
def test_every_rule_replicates_a_dimension_only_another_axis_divides(name):
  lay = layout(**PRIMES)
  size = math.prod(PRIMES[a] for a in sharding.RULES[name])
  for axis, other in PRIMES.items():
    if other != size:  # a dimension of one other axis's size (or of 1) stays replicated
      assert lay.spec((name,), (other,)) == P(None), (name, axis)
  assert lay.spec((name,), (1,)) == P(None)


@pytest.mark.parametrize(
  "axes,shape,spec",
  [
    (("embed", "kv_heads"), (6, 14), P("fsdp", "tensor")),  # k / v projections
    (("heads", "embed"), (14, 6), P("tensor", "fsdp")),  # o projection
    (("expert", "mlp", "embed"), (5, 7, 3), P("expert", "tensor", "fsdp")),  # expert w_down
    (("embed", "vocab"), (3, 7), P("fsdp", "tensor")),  # LM head
    (("batch", "length", "act_embed"), (30, 4, 6), P(("data", "fsdp", "expert"), None, None)),
    (("lookup_rows", "embed"), (210, 3), P(None, "fsdp")),
  ],
)
def test_parameter_and_activation_specs_at_divisible_shapes(axes, shape, spec):
  assert layout(**PRIMES).spec(axes, shape) == spec


def test_rule_overrides_parse_and_round_trip():
  assert sharding.parse_rules(sharding.rules_as_strings()) == sharding.RULES
  rules = sharding.parse_rules({"kv_heads": "", "embed": " data , fsdp ", "mlp": None})
  assert rules["kv_heads"] == () and rules["mlp"] == ()
  assert rules["embed"] == ("data", "fsdp")
  assert {k: v for k, v in rules.items() if k not in ("kv_heads", "embed", "mlp")} == {
    k: v for k, v in sharding.RULES.items() if k not in ("kv_heads", "embed", "mlp")
  }
  lay = sharding.Layout(AbstractMesh(tuple(PRIMES.values()), sharding.MESH_AXES), rules)
  assert lay.spec(("embed", "kv_heads"), (6, 14)) == P(("data", "fsdp"), None)
  assert sharding.rules_as_strings()["batch"] == "data,fsdp,expert"
  assert sharding.rules_as_strings()["length"] == ""
