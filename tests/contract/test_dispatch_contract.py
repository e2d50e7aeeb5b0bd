"""Every registered dispatcher and grouped matmul, at settings drawn from its declared
section, against the brute-force references of dispatch_oracles.py:

  dispatcher      y, the combine-weight gradient and dropped_fraction equal the per-token
                  loop over the slots its declared drop rule keeps, on random skewed
                  routings with invalid slots (capacity: the assignments past C in GShard's
                  priority contribute nothing);
  grouped matmul  an entry with `make`: output on every real row and gradients (rows, w)
                  equal the dense per-row reference on random group sizes, empty groups
                  included; 'fused' and per-token entries: the dispatcher check through
                  'dropless'; an alias: resolves to a registered entry that is checked.

and every setting those parts declare (and the shared expert's) is validated: a bad
value is a one-line ConfigError naming model.moe.<section>.<key>. Cases come from
the registries, so a part registered later is held to the same rules."""

import math

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st
from ml_collections import ConfigDict

from moejax.config import base_config
from moejax.dispatch import DISPATCHERS, GROUPED_MATMULS
from moejax.dispatch.base import CAPACITY_DROPS, DROP_RULES
from moejax.errors import ConfigError
from moejax.experts.swiglu import SWIGLU
from moejax.layers.moe import SHARED
from moejax.validation import validate_config
from tests.contract.dispatch_oracles import (
  check_dispatcher,
  check_grouped_matmul,
  kept,
  random_routing,
  runnable_gmm_backends,
)
from tests.helpers import moe_cfg

# Values each declared setting is drawn from (the dropless layout's are drawn for every
# grouped matmul too: the layout it runs on). A part declaring a new setting adds its
# values here and its bad values to BAD (test_every_declared_setting_has_values_and_bad_values).
VALUES = {
  "dropless.tile": (1, 3, 128),
  "dropless.block": (4, 16, 512),
  "dropless.min_block": (1, 2, 128),
  "capacity.factor": (0.25, 0.5, 1.0, 1.25),
  "capacity.min": (0, 1, 4),
  "gmm.backend": runnable_gmm_backends(),
}
BAD = {
  "dropless.tile": (0, -1, 2.5, True),
  "dropless.block": (0, "512"),
  "dropless.min_block": (0, None),
  "capacity.factor": (0.0, -1.0, math.nan, "1.25"),
  "capacity.min": (-1, 1.5),
  "gmm.backend": ("nope", 3),
  "shared.count": (-1, 0.5),
  "shared.d_ff": (0, -2),
  "shared.gate": ("yes", 1),
}
CONTEXT = {"shared.d_ff": {"count": 1}}  # d_ff is read (and checked) with a shared expert
SHAPES = [(16, 4, 2), (9, 8, 3), (20, 3, 1)]  # (T, E, S)
SECTIONS = {
  spec.settings.path: spec.settings
  for registry in (DISPATCHERS, GROUPED_MATMULS)
  for _, spec in registry.items()
  if spec.settings is not None
}
# One value for every setting in VALUES; a case keeps the keys of the sections it reads.
ANY_SETTINGS = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in VALUES.items()})


def sections(drawn: dict, *parts) -> dict:
  """{section: {key: value}} of `parts` (PartSettings or None) from the drawn values."""
  return {
    part.path: {key: drawn[f"{part.path}.{key}"] for key, _ in part.defaults}
    for part in parts
    if part is not None
  }


@pytest.mark.parametrize("name", list(DISPATCHERS))
@settings(max_examples=6)  # each new shape or setting compiles (suite budget)
@given(st.integers(0, 10_000), st.sampled_from(SHAPES), ANY_SETTINGS)
def test_dispatcher_equals_the_per_token_loop_over_the_slots_it_keeps(name, seed, shape, drawn):
  check_dispatcher(name, seed, shape, **sections(drawn, DISPATCHERS.get(name).settings))


@pytest.mark.parametrize("rule", DROP_RULES)
def test_every_drop_rule_has_an_oracle_and_capacity_drops_in_the_check(rule):
  routing = random_routing(3, 16, 4, 2)
  cfg = moe_cfg(num_experts=4, top_k=2, capacity={"factor": 0.25, "min": 1})
  keep = kept(rule, routing, cfg)
  assert (keep.sum() < np.sum(routing.valid)) == (rule == CAPACITY_DROPS)  # not vacuous


LAYOUT = DISPATCHERS.get("dropless").settings  # the tile layout every matmul runs on


@pytest.mark.parametrize("name", [n for n, spec in GROUPED_MATMULS.items() if spec.make])
@settings(max_examples=5)  # each new layout compiles (suite budget)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=6), st.integers(0, 10_000), ANY_SETTINGS)
@example([0, 5, 0, 7, 0], 0, {}).via("empty groups around real ones, default settings")
@example([0, 0, 0], 1, {}).via("all groups empty, default settings")
def test_grouped_matmul_equals_the_dense_per_row_reference(name, sizes, seed, drawn):
  parts = (LAYOUT, GROUPED_MATMULS.get(name).settings)
  check_grouped_matmul(name, sizes, seed, **(sections(drawn, *parts) if drawn else {}))


@pytest.mark.parametrize(
  "name", [n for n, spec in GROUPED_MATMULS.items() if spec.fused or spec.per_token]
)
@pytest.mark.parametrize("seed,shape", [(0, SHAPES[0]), (1, SHAPES[1])])
def test_a_grouped_matmul_without_a_matmul_keeps_the_dispatcher_contract(name, seed, shape):
  check_dispatcher("dropless", seed, shape, grouped_matmul=name, dropless={"tile": 3})


@pytest.mark.parametrize("name", [n for n, spec in GROUPED_MATMULS.items() if spec.resolve])
def test_an_alias_resolves_to_a_checked_entry(name):
  for experts in (None, SWIGLU.bind({})):
    for few_rows in (False, True):
      target = GROUPED_MATMULS.get(name).resolve(experts, few_rows)
      assert target in GROUPED_MATMULS and GROUPED_MATMULS.get(target).resolve is None, target


def declared(*parts) -> set[str]:
  return {f"{part.path}.{key}" for part in parts for key, _ in part.defaults}


def test_every_declared_setting_has_values_and_bad_values():
  assert {"dropless", "capacity", "gmm"} <= set(SECTIONS)
  assert declared(*SECTIONS.values()) <= set(VALUES)
  assert declared(*SECTIONS.values(), SHARED) <= set(BAD)


@pytest.mark.parametrize(
  "path,key,value",
  [(*k.split("."), v) for k, values in BAD.items() for v in values],
)
def test_a_bad_setting_is_refused_naming_its_key(path, key, value):
  stored = base_config().to_dict()
  stored["model"]["moe"][path].update(CONTEXT.get(f"{path}.{key}", {}), **{key: value})
  with pytest.raises(ConfigError) as error:
    validate_config(ConfigDict(stored))
  message = str(error.value)
  assert message.startswith(f"model.moe.{path}.{key}={value!r}"), message
  assert "\n" not in message
