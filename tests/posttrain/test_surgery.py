"""Removing experts (moejax/posttrain/surgery.py) from a tiny LM: the pruned
layer against a numpy MoE over the kept experts, untouched leaves, state cut
along every expert axis, and refusals."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import lm_shakespeare_moe
from moejax.analysis.router_inference import captured_forward
from moejax.errors import ConfigError
from moejax.models.decoder import abstract_model
from moejax.posttrain import surgery
from moejax.train.loop import init_state

KEEP = {0: [1, 3, 4, 6], 1: [0, 2, 5]}


def tiny(router="topk"):
  config = lm_shakespeare_moe.get_config(f"size=tiny,router={router}")
  _, state, _ = init_state(config)
  host = lambda tree: jax.tree.map(np.asarray, tree)
  return config, host(state.params), host(state.rest)


@functools.partial(jax.jit, static_argnums=0)
def moe_io(graphdef, params, rest, tokens):
  """Per MoE block: its input [T, d] and its output [T, d]."""
  model = nnx.merge(graphdef, params, rest)
  _, _, outputs = captured_forward(model, tokens)
  d = model.cfg.d_model
  return [(outputs[("blocks", i, "ffn_norm", "__call__")].reshape(-1, d),
           outputs[("blocks", i, "ffn", "__call__")][0].reshape(-1, d))
          for i, b in enumerate(model.blocks) if b.is_moe]


def numpy_moe(x, ffn, kept, top_k, scales=None):
  """Top-k over the kept experts' logits, softmax over the chosen (renormalised
  top-k), SwiGLU experts; optionally each output times its scale."""
  x = x.astype(np.float64)
  logits = x @ ffn["router_kernel"].astype(np.float64)[:, kept]
  out = np.zeros_like(x)
  for t in range(x.shape[0]):
    chosen = np.argsort(-logits[t], kind="stable")[:top_k]
    w = np.exp(logits[t, chosen] - logits[t, chosen].max())
    w /= w.sum()
    for weight, j in zip(w, chosen):
      e = kept[j]
      g = x[t] @ ffn["experts"]["w_gate"][e]
      h = (g / (1 + np.exp(-g))) * (x[t] @ ffn["experts"]["w_up"][e])
      scale = 1.0 if scales is None else scales[j]
      out[t] += weight * scale * (h @ ffn["experts"]["w_down"][e])
  return out


@pytest.mark.parametrize("rescale", [False, True])
def test_pruned_layers_equal_a_numpy_moe_over_the_kept_experts(rescale):
  config, params, rest = tiny()
  scales = {0: np.array([0.5, 1.5, -1.0, 2.0]), 1: np.array([1.0, 0.25, 3.0])} if rescale else None
  new, new_params, new_rest = surgery.remove_experts(config.model, params, rest, KEEP, scales)
  assert list(new.moe.expert_counts) == [4, 3]
  assert new_params["blocks"][0]["ffn"]["router_kernel"].shape == (32, 4)
  assert new_params["blocks"][1]["ffn"]["experts"]["w_up"].shape == (3, 32, 32)
  # every leaf outside the MoE layers is the original array
  for path in (("embed",), ("head", "kernel"), ("blocks", 0, "attn", "q", "kernel")):
    np.testing.assert_array_equal(
        functools.reduce(lambda t, k: t[k], path, new_params),
        functools.reduce(lambda t, k: t[k], path, params))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, size=(2, 12)), jnp.int32)
  graphdef = abstract_model(new)[0]
  for block, (x, y) in zip(KEEP, moe_io(graphdef, new_params, new_rest, tokens)):
    expected = numpy_moe(np.asarray(x), params["blocks"][block]["ffn"], KEEP[block],
                         config.model.moe.top_k, None if scales is None else scales[block])
    np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


def test_keeping_every_expert_changes_nothing():
  config, params, rest = tiny()
  new, new_params, _ = surgery.remove_experts(config.model, params, rest,
                                              {0: range(8), 1: range(8)})
  assert new.moe.num_experts == 8 and not new.moe.expert_counts
  jax.tree.map(np.testing.assert_array_equal, new_params, params)


def test_router_state_is_cut_along_its_expert_axis():
  config, params, rest = tiny("sigmoid_bias")
  rest["blocks"][0]["ffn"]["router_state"]["bias"] = np.arange(8, dtype=np.float32)
  _, _, new_rest = surgery.remove_experts(config.model, params, rest, KEEP)
  np.testing.assert_array_equal(new_rest["blocks"][0]["ffn"]["router_state"]["bias"], KEEP[0])


@pytest.mark.parametrize("keep,message", [
    ({0: [0]}, r"keep\[0\] has 1 experts, below model.moe.top_k=2"),
    ({0: [0, 0, 1]}, r"keep\[0\]=\[0, 0, 1\] must be distinct experts in \[0, 8\)"),
    ({0: [3, 8]}, r"must be distinct experts in \[0, 8\)"),
    ({5: [0, 1]}, r"keep names blocks \[5\], which are not MoE blocks \[0, 1\]"),
])
def test_bad_keep_sets_are_refused(keep, message):
  config, params, rest = tiny()
  with pytest.raises(ConfigError, match=message):
    surgery.remove_experts(config.model, params, rest, keep)


def test_merge_takes_the_mass_weighted_mean_of_the_merged_experts():
  config, params, rest = tiny()
  mass = np.arange(1.0, 9.0)  # expert e has mass e + 1
  merged = surgery.merge_experts(params, 0, {2: 1, 5: 1, 7: 3}, mass)
  for name, w in params["blocks"][0]["ffn"]["experts"].items():
    got, w = merged["blocks"][0]["ffn"]["experts"][name], w.astype(np.float64)
    np.testing.assert_allclose(got[1], (2 * w[1] + 3 * w[2] + 6 * w[5]) / 11, atol=1e-8)
    np.testing.assert_allclose(got[3], (4 * w[3] + 8 * w[7]) / 12, atol=1e-8)
    np.testing.assert_array_equal(got[0], w[0].astype(np.float32))
    np.testing.assert_array_equal(merged["blocks"][1]["ffn"]["experts"][name],
                                  params["blocks"][1]["ffn"]["experts"][name])
  np.testing.assert_array_equal(params["blocks"][0]["ffn"]["experts"]["w_up"][1],
                                tiny()[1]["blocks"][0]["ffn"]["experts"]["w_up"][1])  # no mutation


def test_step_no_merge_keeps_steps_experts_and_only_removes_the_rest():
  """`step` and `step_no_merge` keep the same experts; without the merge the pruned
  params are exactly the removal, with it the kept experts absorbed the pruned."""
  from moejax.posttrain import prune
  from moejax.posttrain.calibration import Calibration
  config, params, rest = tiny()
  windows = np.random.default_rng(0).integers(0, 256, size=(8, 16)).astype(np.int32)
  calibration = Calibration(config.model, params, rest, windows)
  run = {method: prune.prune_model(config.model, params, rest, keep="4", method=method,
                                   calibration=calibration)
         for method in ("step", "step_no_merge")}
  kept = {layer["block"]: layer["kept"] for layer in run["step_no_merge"][3]}
  assert kept == {layer["block"]: layer["kept"] for layer in run["step"][3]}
  _, want, _ = surgery.remove_experts(config.model, params, rest, kept)
  jax.tree.map(np.testing.assert_array_equal, run["step_no_merge"][1], want)
  merged = run["step"][1]["blocks"][0]["ffn"]["experts"]["w_up"]
  assert not np.allclose(merged, want["blocks"][0]["ffn"]["experts"]["w_up"])
