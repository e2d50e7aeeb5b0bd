"""Every registered merge method (moejax/merging), edit method (moejax/editing) and
post-training method (moejax/posttrain/methods.py: pruners, quantizers,
decompositions), driven by the registries, so a method added later is held to the
same rules: settings bound once from declared defaults, an unknown setting refused
naming it; merging copies of one model returns that model, and differing shapes
name the parameter; a layer edit with nothing to change (R = 0) changes nothing,
leaves experts no row routes to alone, and lowers the edit objective otherwise; the
post-training contracts of tests/contract/posttrain_oracles.py (a pruner at keep=1.0
returns the model unchanged and selects valid subsets, a quantizer reproduces its
grid and stays within half a step at 8 bits, a decomposition reproduces a low-rank
stack and never stores more than dense)."""

import numpy as np
import pytest

from moejax.editing import methods as edit_methods
from moejax.errors import ConfigError
from moejax.merging import base as merging
from moejax.posttrain import methods as posttrain
from tests.contract import posttrain_oracles

MERGES = list(merging.MERGE_METHODS)
EDITS = list(edit_methods.EDIT_METHODS)
LAYER_EDITS = [n for n in EDITS if edit_methods.get(n).kind == "layer"]


def tree(seed):
  rng = np.random.default_rng(seed)
  return {"embed": rng.standard_normal((5, 3)), "blocks": {"0": {"w": rng.standard_normal((3, 4))}}}


def test_the_registries_hold_the_methods_this_file_is_about():
  assert {"task_arithmetic", "ties", "average"} <= set(MERGES)
  assert {"moe_edit", "lstsq", "finetune"} <= set(EDITS)
  assert {"schur_astar", "step", "random", "heapr", "atom_random"} <= set(posttrain.PRUNERS)
  assert {"rtn", "gptq", "kmeans"} <= set(posttrain.QUANTIZERS)
  assert {"td_moe", "tucker", "svd", "whitened_svd"} <= set(posttrain.DECOMPOSITIONS)


@pytest.mark.parametrize("kind,name", posttrain_oracles.every_method())
def test_a_posttrain_method_keeps_its_contract(kind, name):
  posttrain_oracles.check(kind, name)


@pytest.mark.parametrize("kind,name", posttrain_oracles.every_method())
def test_a_posttrain_method_refuses_an_unknown_setting_naming_it(kind, name):
  registry = posttrain_oracles.REGISTRIES[kind][0]
  flag = registry.config_key
  with pytest.raises(ConfigError, match=f"^--nonsense=1 is not a setting of {flag}={name}; "):
    registry.get(name).bind(nonsense=1)


@pytest.mark.parametrize("name", MERGES)
def test_merging_copies_of_one_model_returns_it(name):
  model = tree(0)
  merged = merging.bind(name)(model, [model, model, model])
  np.testing.assert_allclose(merged["embed"], model["embed"], atol=1e-12)
  np.testing.assert_allclose(merged["blocks"]["0"]["w"], model["blocks"]["0"]["w"], atol=1e-12)


@pytest.mark.parametrize("name", MERGES)
def test_a_merge_refuses_unknown_settings_and_differing_shapes(name):
  with pytest.raises(ConfigError, match=f"--nonsense=1 is not a setting of --method={name}"):
    merging.bind(name, {"nonsense": 1})
  other = tree(1)
  other["blocks"]["0"]["w"] = np.zeros((3, 5))
  with pytest.raises(ConfigError, match=r"blocks.*w.*\(3, 4\).*\(3, 5\)"):
    merging.bind(name)(tree(0), [tree(0), other])


@pytest.mark.parametrize("name", EDITS)
def test_an_edit_method_binds_its_defaults_and_refuses_unknown_settings(name):
  method = edit_methods.get(name)
  assert edit_methods.get(name).bind().options == method.defaults
  with pytest.raises(ConfigError, match=f"edit method '{name}' has no setting nonsense=1"):
    method.bind({"nonsense": 1})


def edit_problem(seed, t=12, e=4, d=3, f=5):
  rng = np.random.default_rng(seed)
  gates = rng.uniform(0.2, 1.0, (t, e)) * (rng.random((t, e)) < 0.5)
  gates[:, -1] = 0  # the last expert: no row routes to it
  return rng.standard_normal((t, d)), gates, rng.standard_normal((t, e, f))


def objective(R, gates, keys, deltas):
  return float(np.sum(np.square(R + np.einsum("te,edf,tef->td", gates, deltas, keys))))


@pytest.mark.parametrize("name", LAYER_EDITS)
def test_a_layer_edit_changes_nothing_with_nothing_to_change_and_lowers_its_objective(name):
  bound = edit_methods.get(name).bind({"lam": 1e-3})
  R, gates, keys = edit_problem(0)
  f = keys.shape[2]
  projectors = np.broadcast_to(np.eye(f), (gates.shape[1], f, f))

  def solve(residual):
    return np.asarray(bound.method.solve(residual, gates, keys, projectors, bound.options))

  np.testing.assert_array_equal(solve(np.zeros_like(R)), 0)
  deltas = solve(R)
  np.testing.assert_array_equal(deltas[-1], 0)
  assert objective(R, gates, keys, deltas) < 0.5 * objective(R, gates, keys, 0 * deltas)
