"""Expert type 'factorised' (TD-MoE's shared Tucker factors plus per-expert
cores, moejax/experts/factorised.py) and its conversion from trained SwiGLU
experts (moejax/posttrain/factorise.py): full ranks give the swiglu layer,
the stored count is the Tucker count, bad ranks are refused by key, a tiny LM
trains, checkpoints exactly and decodes with a KV cache like its full
forward. Every dispatcher and grouped matmul: tests/contract."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.configs import lm_shakespeare_moe
from moejax.validation import validate_config
from moejax.errors import ConfigError
from moejax.experts.factorised import FactorisedExperts, build_factorised
from moejax.layers.moe import MoELayer
from moejax.models.decoder import abstract_model
from moejax.posttrain import tucker
from moejax.posttrain.factorise import factorise_experts, factorised_config
from moejax.posttrain.measure import parameter_bytes
from moejax.train.loop import init_state, train_and_evaluate
from moejax.train.restore import load_from_workdir
from tests.helpers import moe_cfg

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

E, D, F = 4, 8, 10
RANKS = {"w_gate": (3, 5, 7), "w_up": (2, 4, 6), "w_down": (4, 6, 3)}
# By hand: r_E r_in r_out + E r_E + d_in r_in + d_out r_out per projection.
HAND_COUNT = (
  (105 + 12 + 40 + 70)  # w_gate [4, 8, 10] at (3, 5, 7)
  + (48 + 8 + 32 + 60)  # w_up [4, 8, 10] at (2, 4, 6)
  + (72 + 16 + 60 + 24)
)  # w_down [4, 10, 8] at (4, 6, 3)
TINY_RANKS = {"w_gate": (4, 16, 16), "w_up": (4, 16, 16), "w_down": (4, 16, 12)}


def layer_pair(ranks):
  """(swiglu layer, factorised layer with the same router) at d=16, E=4, f=12, top-2."""
  common = dict(num_experts=4, top_k=2, expert_d_ff=12)
  swiglu = MoELayer(16, moe_cfg(experts="swiglu", **common), rngs=nnx.Rngs(0), dtype=jnp.float32)
  section = {f"ranks_{k[2:]}": ranks for k in ("w_gate", "w_up", "w_down")}
  fact = MoELayer(
    16,
    moe_cfg(experts="factorised", factorised=section, **common),
    rngs=nnx.Rngs(1),
    dtype=jnp.float32,
  )
  fact.router_kernel.set_value(swiglu.router_kernel[...])
  return swiglu, fact


def load_factors(experts_module, params):
  for projection, fields in params.items():
    for name, value in fields.items():
      getattr(getattr(experts_module, projection), name).set_value(jnp.asarray(value))


@pytest.mark.integration
@pytest.mark.parametrize("ranks,full", [((0, 0, 0), True), ((2, 6, 6), False)])
def test_full_rank_factorised_layer_is_the_swiglu_layer(ranks, full):
  """TD-MoE of the swiglu layer's experts (whitened by x and by the hidden
  activations) at full ranks: the same layer output (1e-5); truncated: not."""
  swiglu, fact = layer_pair(ranks)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 24, 16)).astype(np.float32)
  calibration = (rng.standard_normal((256, 16)) * np.linspace(1.0, 0.3, 16)).astype(np.float32)
  w = {k: np.asarray(getattr(swiglu.experts, k)[...]) for k in ("w_gate", "w_up", "w_down")}
  hidden = np.concatenate(
    [jax.nn.silu(calibration @ g) * (calibration @ u) for g, u in zip(w["w_gate"], w["w_up"])]
  )  # [E n, f]
  params, got_ranks = factorise_experts(w, calibration, ranks, hidden_inputs=hidden)
  load_factors(fact.experts, params)
  want, _ = swiglu(jnp.asarray(x))
  got, _ = fact(jnp.asarray(x))
  err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
  print(f"ranks {got_ranks}: max |y - y_swiglu| / max |y_swiglu| = {err:.3g}")
  if full:
    assert got_ranks == {"w_gate": (4, 16, 12), "w_up": (4, 16, 12), "w_down": (4, 12, 16)}
    assert err <= 1e-5
    for k in w:  # the stored factors rebuild each expert's matrix
      np.testing.assert_allclose(getattr(fact.experts, k).dense(), w[k], atol=1e-5)
  else:
    assert err > 1e-2


def test_stored_parameters_are_the_tucker_count_and_the_params():
  module = FactorisedExperts(E, D, F, RANKS, rngs=nnx.Rngs(0))
  shapes = {"w_gate": (E, D, F), "w_up": (E, D, F), "w_down": (E, F, D)}
  by_formula = sum(tucker.tucker_parameters(shapes[k], RANKS[k]) for k in RANKS)
  params = nnx.state(module, nnx.Param)
  stored = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params))
  print(f"stored {stored} parameters vs dense swiglu {3 * E * D * F}")
  assert module.parameters == by_formula == HAND_COUNT == stored == 547
  assert parameter_bytes(params) == 4 * HAND_COUNT  # float32, as stored
  # What build makes from the config, and what factorise_experts produces, agree.
  section = {f"ranks_{k[2:]}": RANKS[k] for k in RANKS}
  built = build_factorised(E, D, moe_cfg(expert_d_ff=F, factorised=section), rngs=nnx.Rngs(0))
  assert built.parameters == HAND_COUNT
  rng = np.random.default_rng(1)
  dense = {k: rng.standard_normal(shapes[k]) for k in shapes}
  factors, _ = factorise_experts(dense, rng.standard_normal((64, D)), RANKS)
  assert sum(v.size for t in factors.values() for v in t.values()) == HAND_COUNT
  assert jax.tree.map(np.shape, factors) == jax.tree.map(np.shape, nnx.to_pure_dict(params))


@pytest.mark.parametrize(
  "key,value,match",
  [
    ("ranks_gate", (5, 0, 0), r"ranks_gate=\(5, 0, 0\): rank_expert=5 exceeds num_experts=4"),
    ("ranks_gate", (0, 9, 0), r"ranks_gate=\(0, 9, 0\): rank_in=9 exceeds d_model=8"),
    ("ranks_up", (0, 0, 11), r"ranks_up=\(0, 0, 11\): rank_out=11 exceeds expert_d_ff=10"),
    ("ranks_down", (0, 11, 0), r"ranks_down=\(0, 11, 0\): rank_in=11 exceeds expert_d_ff=10"),
    ("ranks_down", (0, 0, 9), r"ranks_down=\(0, 0, 9\): rank_out=9 exceeds d_model=8"),
  ],
)
def test_ranks_larger_than_the_dimensions_are_refused(key, value, match):
  cfg = moe_cfg(num_experts=E, expert_d_ff=F, factorised={key: value})
  with pytest.raises(ConfigError, match=r"model\.moe\.factorised\." + match):
    build_factorised(E, D, cfg, rngs=nnx.Rngs(0))


def test_malformed_ranks_are_refused_by_validation_and_a_too_large_one_by_the_model():
  for value in [(1, 2), (-1, 0, 0), (1.5, 0, 0), (0, True, 0)]:
    c = lm_shakespeare_moe.get_config("size=tiny")
    c.model.moe.factorised.ranks_up = value
    with pytest.raises(ConfigError, match=re.escape(f"model.moe.factorised.ranks_up={value!r}")):
      validate_config(c)
  m = lm_shakespeare_moe.get_config("size=tiny").model
  m.moe.experts, m.moe.factorised.ranks_gate = "factorised", (0, 33, 0)
  with pytest.raises(
    ConfigError,
    match=r"ranks_gate=\(0, 33, 0\): rank_in=33 exceeds "
    r"d_model=32",
  ):
    abstract_model(m)


@pytest.mark.integration
def test_tiny_lm_trains_and_its_checkpoint_restores_exactly(tiny_config, tmp_path):
  config = factorised_config(tiny_config(steps=2, checkpoint_every=2, eval_batches=1), TINY_RANKS)
  validate_config(config)
  _, initial, _ = init_state(config)
  run = train_and_evaluate(config, str(tmp_path), write_metrics=False)
  losses = [r["loss"] for r in run.history]
  assert losses and np.all(np.isfinite(losses)) and np.isfinite(run.eval["val_loss"])
  saved_config, _, params, _, _ = load_from_workdir(str(tmp_path))
  assert saved_config.model.moe.experts == "factorised"
  assert [tuple(saved_config.model.moe.factorised[f"ranks_{k[2:]}"]) for k in TINY_RANKS] == list(
    TINY_RANKS.values()
  )

  def host(tree):
    return jax.tree.map(np.asarray, tree)

  jax.tree.map(np.testing.assert_array_equal, host(params), host(run.state.params))
  experts = host(params)["blocks"][0]["ffn"]["experts"]
  assert set(experts) == set(TINY_RANKS)
  count = sum(tucker.tucker_parameters((8, 32, 32), ranks) for ranks in TINY_RANKS.values())
  assert count == 2 * 2080 + 1696  # vs 3 x 8,192 of the dense swiglu experts
  assert parameter_bytes(experts) == 4 * count  # float32, as stored and saved
  before = host(initial.params)["blocks"][0]["ffn"]["experts"]
  for k in TINY_RANKS:  # every stored factor is trained, the shared ones included
    for name, value in experts[k].items():
      assert np.abs(value - before[k][name]).max() > 0, (k, name)


def test_factorised_config_validates_and_leaves_the_source_alone():
  source = lm_shakespeare_moe.get_config("size=tiny")
  source.model.moe.grouped_matmul = "fused"
  c = factorised_config(source, TINY_RANKS)
  validate_config(c)
  assert (c.model.moe.experts, c.model.moe.grouped_matmul) == ("factorised", "auto")
  assert source.model.moe.experts == "swiglu"
  assert isinstance(c, ml_collections.ConfigDict)
