"""Scan over layers and remat policies compute what the plain loop computes:
outputs, gradients and router state (1e-6), the scanned model holding the loop
model's variables stacked (stack_layers: built from a seed, it draws one key per
layer, other parameters), an L3 layer in every block included; layers that differ
and unknown policies are refused by name before anything is built."""

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.configs.lm_shakespeare_moe import get_config
from moejax.layers.lookup import allocate_rows
from moejax.validation import validate_model
from moejax.errors import ConfigError
from moejax.models import Decoder
from moejax.models.decoder import REMAT_POLICIES, abstract_model, stack_layers, unstack_layers
from moejax.models.scanned import with_scan_layers
from moejax.sharding import logical_axes_of
from moejax.train.step import cross_entropy, split_model

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


def model_config(**keys):
  m = get_config("size=tiny,router=sigmoid_bias").model  # router state: the aux-loss-free bias
  m.num_layers = 3
  m.moe.loss_weights = {"z_loss": 1e-3, "load_balance": 1e-2}
  for key, value in keys.items():
    m[key] = value
  validate_model(m)
  return ml_collections.FrozenConfigDict(m)


TOKENS = jax.random.randint(jax.random.key(3), (2, 16), 0, 256)


def loop_variables(m, l3_rows=None):
  """(graphdef, params, rest) of Decoder(m) holding the loop model's seed-0 variables,
  stacked when m is scanned."""
  loop_m = ml_collections.FrozenConfigDict(with_scan_layers(m, False))
  _, params, rest = split_model(Decoder(loop_m, rngs=nnx.Rngs(0), l3_rows=l3_rows))
  if m.scan_layers:
    _, params, rest = stack_layers(loop_m, params, rest)
  return abstract_model(m)[0], params, rest


def loss_and_grads(m, l3_rows=None):
  """(loss, grads, rest after the step) of one training forward+backward from the loop
  model's variables, in the loop layout."""
  graphdef, params, rest = loop_variables(m, l3_rows)

  def loss_fn(params):
    model = nnx.merge(graphdef, params, rest)
    logits, aux, _ = model(TOKENS[:, :-1], train=True, rng=jax.random.key(1))
    loss = cross_entropy(logits, TOKENS[:, 1:]) + aux["aux_loss"]
    return loss, split_model(model)[2]

  (loss, new_rest), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
  _, grads, new_rest = unstack_layers(m, grads, new_rest)
  return loss, grads, new_rest


def shapes(tree):
  return jax.tree.map(lambda a: (a.shape, a.dtype), tree)


def assert_trees_close(a, b, atol):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0)


@pytest.fixture(scope="module")
def loop_reference():
  return loss_and_grads(model_config())


def test_scanned_model_holds_the_loop_parameters_stacked():
  """stack_layers gives the loop model's variables the scanned model's tree, which the
  scanned graph holds as they are and unstack_layers gives back exactly; the logical
  axes gain the layer axis (None) in front; each layer draws from its own key."""
  loop_m, scanned_m = model_config(), model_config(scan_layers=True)
  loop_model = Decoder(loop_m, rngs=nnx.Rngs(0))
  scanned_model = Decoder(scanned_m, rngs=nnx.Rngs(0))
  loop, scanned = split_model(loop_model), split_model(scanned_model)
  stacked_m, params, rest = stack_layers(loop_m, loop[1], loop[2])
  assert stacked_m.scan_layers and stack_layers(scanned_m, params, rest)[1] is params
  assert shapes((params, rest)) == shapes(scanned[1:])
  held = split_model(nnx.merge(scanned[0], params, rest))
  assert_trees_close(held[1:], (params, rest), atol=0)
  _, params, rest = unstack_layers(stacked_m, params, rest)
  assert_trees_close(params, loop[1], atol=0)
  assert_trees_close(rest, loop[2], atol=0)

  assert rest["blocks"][0]["ffn"]["router_state"]["bias"].shape == (8,)
  assert scanned[2]["blocks"]["block"]["ffn"]["router_state"]["bias"].shape == (3, 8)
  loop_axes = logical_axes_of(nnx.state(loop_model))["blocks"][0]
  scanned_axes = logical_axes_of(nnx.state(scanned_model))["blocks"]["block"]
  assert scanned_axes == jax.tree.map(lambda a: type(a)((None, *a.names)), loop_axes)
  kernel = np.asarray(scanned[1]["blocks"]["block"]["attn"]["q"]["kernel"])
  assert kernel.shape[0] == 3 and len({layer.tobytes() for layer in kernel}) == 3


@pytest.mark.integration
@pytest.mark.parametrize(
  "scan,remat",
  [
    (True, "none"),
    (False, "full"),
    (False, "save_moe_routing"),
    (True, "save_moe_routing"),
    (True, "dots"),
  ],
)
def test_scan_and_remat_equal_the_loop(scan, remat, loop_reference):
  loss, grads, rest = loss_and_grads(model_config(scan_layers=scan, remat=remat))
  ref_loss, ref_grads, ref_rest = loop_reference
  np.testing.assert_allclose(float(loss), float(ref_loss), atol=1e-6, rtol=0)
  assert_trees_close(grads, ref_grads, atol=1e-6)
  assert_trees_close(rest, ref_rest, atol=1e-6)  # the bias moved once per layer, as in the loop
  bias = rest["blocks"][0]["ffn"]["router_state"]["bias"]
  assert np.abs(np.asarray(bias)).max() > 0


def l3_config(layers, **keys):
  """model_config with an L3 layer (tiny tables) after each block in `layers`."""
  m = ml_collections.ConfigDict(model_config(**keys).to_dict())
  m.l3.update(enabled=True, layers=layers, budget=600, cap=8, d_emb=16, d_up=32)
  validate_model(m)
  return ml_collections.FrozenConfigDict(m)


@pytest.mark.integration
def test_a_model_with_l3_in_every_block_scans_and_equals_the_loop():
  """The L3 layer is part of its block, so a model with one in every block scans: the
  loss, every gradient (the lookup tables' included) and the router state of the
  scanned (and rematerialised) model equal the loop's within 1e-6. Rows per id are
  unequal (1 to cap), so a table read at the wrong offset would show."""
  rows = allocate_rows(np.random.default_rng(0).gamma(0.3, size=256), 600, 8)
  assert rows.min() == 1 and rows.max() == 8
  loss, grads, rest = loss_and_grads(l3_config((0, 1, 2)), rows)
  lookup_grads = np.asarray(grads["blocks"][2]["lookup"]["keys"])
  assert np.abs(lookup_grads).max() > 0
  for remat in ("none", "save_moe_routing"):
    scanned = loss_and_grads(l3_config((0, 1, 2), scan_layers=True, remat=remat), rows)
    np.testing.assert_allclose(float(scanned[0]), float(loss), atol=1e-6, rtol=0)
    assert_trees_close(scanned[1], grads, atol=1e-6)
    assert_trees_close(scanned[2], rest, atol=1e-6)
    np.testing.assert_array_equal(scanned[2]["blocks"][1]["lookup"]["lengths"], rows)


def test_a_model_without_its_l3_rows_is_refused_before_it_is_built():
  """Building a model reads no corpus: the rows come from moejax/data/l3_allocation.py."""
  with pytest.raises(ValueError, match=r"block 1 has an L3 layer .* pass its table's rows"):
    Decoder(l3_config((1,)), rngs=nnx.Rngs(0))


def test_every_remat_policy_is_covered():
  assert set(REMAT_POLICIES) == {"none", "full", "dots", "save_moe_routing"}


@pytest.mark.parametrize(
  "keys,message",
  [
    (
      dict(scan_layers=True, ffn_type="moe", moe_first_dense=1),
      r"model\.scan_layers=True needs identical layers; layers \[1, 2\] are MoE",
    ),
    (dict(scan_layers=True, windows=[0, 8, 0]), r"model\.attention\.windows=\[0, 8, 0\] differ"),
    (
      dict(scan_layers=True, l3_layers=(1,)),
      r"model\.scan_layers=True needs identical layers; blocks \[1\] end with an L3 layer",
    ),
    (
      dict(remat="everything"),
      r"model\.remat='everything' is not known; valid: dots, full, none, save_moe_routing",
    ),
  ],
)
def test_bad_scale_settings_are_refused_by_name(keys, message):
  m = get_config("size=tiny").model
  m.num_layers = 3
  m.moe.first_dense = keys.pop("moe_first_dense", 0)
  if "windows" in keys:
    m.attention.windows = keys.pop("windows")
  if "l3_layers" in keys:
    m.l3.update(enabled=True, layers=keys.pop("l3_layers"), budget=600, cap=8)
  for key, value in keys.items():
    m[key] = value
  with pytest.raises(ConfigError, match=message):
    validate_model(m)


@pytest.mark.integration
def test_the_trainer_runs_a_scanned_rematerialised_model_with_a_stateful_router(tmp_path):
  """Through train_and_evaluate: the bias router's state moves inside the scan."""
  from moejax.train.loop import train_and_evaluate

  c = get_config("size=tiny,router=sigmoid_bias")
  c.model.scan_layers, c.model.remat = True, "save_moe_routing"
  c.train.steps, c.train.log_every, c.train.eval_batches, c.train.progress_bar = 3, 1, 1, False
  run = train_and_evaluate(c, str(tmp_path / "run"), write_metrics=False)
  bias = np.asarray(run.state.rest["blocks"]["block"]["ffn"]["router_state"]["bias"])
  assert bias.shape[0] == c.model.num_layers and np.abs(bias).max() > 0
  c.train.micro_batches = 2
  with pytest.raises(ConfigError, match=r"train\.micro_batches=2 with model\.scan_layers=True"):
    train_and_evaluate(c, str(tmp_path / "other"))
