"""Sparse upcycling (moejax/train/upcycle.py): an MoE started from a dense checkpoint."""

import os

import jax
import numpy as np
import pytest
from flax import nnx

from moejax.validation import validate_config
from moejax.errors import ConfigError
from moejax.train import init_from
from moejax.train.loop import init_state, train_and_evaluate
from moejax.train.restore import load_from_workdir
from moejax.train.upcycle import upcycle_params, upcycled


# The tiny LM (8 experts of width 32, top-2; its dense twin has d_ff 64, 2 segments),
# trained 2 steps: tiny_config(arg, **STEPS).
STEPS = dict(steps=2, checkpoint_every=2)


def upcycled_from(tiny_config, workdir):
  """The tiny MoE's config, to start from the dense checkpoint in `workdir`."""
  c = tiny_config(**STEPS)
  c.init.upcycle_from = workdir
  return c


@pytest.fixture(scope="module")
def dense_workdir(tmp_path_factory, tiny_config):
  workdir = str(tmp_path_factory.mktemp("dense"))
  dense = tiny_config("dense=True", **STEPS)
  dense.seed = 1  # not the MoE's seed: its attention starts elsewhere
  train_and_evaluate(dense, workdir, write_metrics=False)
  return workdir


@pytest.mark.integration
def test_experts_are_segments_of_the_dense_ffn_and_a_zero_router_gives_its_logits(
  dense_workdir, tiny_config
):
  config = upcycled_from(tiny_config, dense_workdir)
  validate_config(config)
  init_from.check_sources(config)
  dense_config, _, dense_params, _, _ = load_from_workdir(dense_workdir)
  graphdef, state, _ = init_state(config)
  params, rest = upcycled(config, jax.device_get(state.params), jax.device_get(state.rest))
  k = config.model.moe.top_k
  for i, block in params["blocks"].items():
    dense_ffn = dense_params["blocks"][i]["ffn"]
    for e in range(8):  # expert e holds segment e mod 2 of the 64 dense columns
      cols = slice(32 * (e % 2), 32 * (e % 2) + 32)
      np.testing.assert_array_equal(
        block["ffn"]["experts"]["w_gate"][e], dense_ffn["gate"]["kernel"][:, cols]
      )
      np.testing.assert_array_equal(
        block["ffn"]["experts"]["w_up"][e], dense_ffn["up"]["kernel"][:, cols]
      )
      np.testing.assert_array_equal(
        block["ffn"]["experts"]["w_down"][e], k * np.asarray(dense_ffn["down"]["kernel"][cols])
      )
    np.testing.assert_array_equal(
      block["attn"]["q"]["kernel"], dense_params["blocks"][i]["attn"]["q"]["kernel"]
    )
    # the router keeps its fresh initialisation
    np.testing.assert_array_equal(
      block["ffn"]["router_kernel"], state.params["blocks"][i]["ffn"]["router_kernel"]
    )
  # A zero router: equal weights 1/2 on experts 0 and 1 (ties pick the lowest),
  # segments 0 and 1 once each, times top_k = 2: the dense FFN exactly.
  for block in params["blocks"].values():
    block["ffn"]["router_kernel"] = np.zeros_like(block["ffn"]["router_kernel"])
  tokens = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int32)
  moe_logits = nnx.merge(graphdef, params, rest)(tokens)[0]
  dense_graphdef, dense_state, _ = init_state(dense_config)
  dense_logits = nnx.merge(dense_graphdef, dense_params, dense_state.rest)(tokens)[0]
  np.testing.assert_allclose(moe_logits, dense_logits, rtol=2e-5, atol=2e-5)
  assert np.max(np.abs(np.asarray(dense_logits))) > 0.1  # not vacuous


@pytest.mark.integration
def test_the_trainer_starts_from_the_upcycled_weights(dense_workdir, tiny_config, tmp_path):
  config = upcycled_from(tiny_config, dense_workdir)
  config.train.steps = 1
  run = train_and_evaluate(config, str(tmp_path / "moe"), write_metrics=False)
  assert run.start_step == 0
  _, _, dense_params, _, _ = load_from_workdir(dense_workdir)
  fresh = init_state(config)[1].params

  def q(p):
    return np.asarray(p["blocks"][0]["attn"]["q"]["kernel"])

  moved = np.max(np.abs(q(run.state.params) - q(dense_params)))
  assert moved <= 1.01 * config.train.learning_rate  # one Adam step from the dense weights
  assert np.max(np.abs(q(fresh) - q(dense_params))) > 20 * config.train.learning_rate


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(hf_dir="/x"), r"init\.upcycle_from=.* and init\.hf_dir=/x are both set"),
    (dict(upcycle_step=7), r"no checkpoint of step 7; it holds \[2\]"),
    (dict(expert_d_ff=48), r"dense d_ff=64 must be a multiple of model\.moe\.expert_d_ff=48"),
    (dict(num_experts=3), r"num_experts=3 a multiple of the 2 segments"),
    (dict(d_model=48), r"model\.d_model=48 but the dense model has 32"),
    (dict(ffn_type="dense"), r"starts an MoE \(model\.ffn_type='dense'\) from a dense"),
  ],
)
def test_refused_before_anything_is_built(dense_workdir, tiny_config, tmp_path, change, message):
  config = upcycled_from(tiny_config, dense_workdir)
  for key, value in change.items():
    section = (
      config.init
      if key in ("hf_dir", "upcycle_step")
      else config.model.moe
      if key in ("expert_d_ff", "num_experts")
      else config.model
    )
    section[key] = value
  with pytest.raises(ConfigError, match=message):
    train_and_evaluate(config, str(tmp_path / "run"), write_metrics=False)
  assert not os.path.exists(tmp_path / "run")


def test_a_directory_without_checkpoints_is_refused(tiny_config, tmp_path):
  with pytest.raises(ConfigError, match=r"init\.upcycle_from=.*: not a training workdir"):
    init_from.check_sources(upcycled_from(tiny_config, str(tmp_path)))


def test_upcycle_params_copies_whole_ffns_when_widths_match():
  """Sparse Upcycling's own case (G = 1): every expert is the whole dense FFN."""
  rng = np.random.default_rng(0)
  dense = {
    "embed": rng.normal(size=(4, 2)),
    "blocks": {
      0: {
        "ffn": {
          "gate": {"kernel": rng.normal(size=(2, 3))},
          "up": {"kernel": rng.normal(size=(2, 3))},
          "down": {"kernel": rng.normal(size=(3, 2))},
        }
      }
    },
  }
  moe = {
    "embed": np.zeros((4, 2)),
    "blocks": {
      0: {
        "ffn": {
          "router_kernel": np.ones((2, 4)),
          "experts": {
            "w_gate": np.zeros((4, 2, 3)),
            "w_up": np.zeros((4, 2, 3)),
            "w_down": np.zeros((4, 3, 2)),
          },
        }
      }
    },
  }
  out = upcycle_params(dense, moe, top_k=1)
  for e in range(4):
    np.testing.assert_array_equal(
      out["blocks"][0]["ffn"]["experts"]["w_down"][e], dense["blocks"][0]["ffn"]["down"]["kernel"]
    )
  np.testing.assert_array_equal(out["embed"], dense["embed"])
  np.testing.assert_array_equal(out["blocks"][0]["ffn"]["router_kernel"], 1.0)
