"""Removing experts (moejax/posttrain/surgery.py) from a tiny LM: the pruned
layer against a numpy MoE over the kept experts, untouched leaves, state cut
along every expert axis, and refusals."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.configs import lm_shakespeare_moe
from moejax.errors import ConfigError
from moejax.models.capture import captured_forward
from moejax.models.decoder import abstract_model
from moejax.posttrain import surgery
from moejax.train.loop import init_state

from tests.helpers import host

KEEP = {0: [1, 3, 4, 6], 1: [0, 2, 5]}


@functools.partial(jax.jit, static_argnums=0)
def moe_io(graphdef, params, rest, tokens):
  """Per MoE block: its input [T, d] and its output [T, d]."""
  model = nnx.merge(graphdef, params, rest)
  _, _, outputs = captured_forward(model, tokens)
  d = model.cfg.d_model
  return [
    (
      outputs[("blocks", i, "ffn_norm", "__call__")].reshape(-1, d),
      outputs[("blocks", i, "ffn", "__call__")][0].reshape(-1, d),
    )
    for i, b in enumerate(model.blocks)
    if b.is_moe
  ]


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
def test_pruned_layers_equal_a_numpy_moe_over_the_kept_experts(rescale, tiny_model):
  config, _, state = tiny_model
  params, rest = host(state.params), host(state.rest)
  scales = {0: np.array([0.5, 1.5, -1.0, 2.0]), 1: np.array([1.0, 0.25, 3.0])} if rescale else None
  new, new_params, new_rest = surgery.remove_experts(config.model, params, rest, KEEP, scales)
  assert list(new.moe.expert_counts) == [4, 3]
  assert new_params["blocks"][0]["ffn"]["router_kernel"].shape == (32, 4)
  assert new_params["blocks"][1]["ffn"]["experts"]["w_up"].shape == (3, 32, 32)
  # every leaf outside the MoE layers is the original array
  for path in (("embed",), ("head", "kernel"), ("blocks", 0, "attn", "q", "kernel")):
    np.testing.assert_array_equal(
      functools.reduce(lambda t, k: t[k], path, new_params),
      functools.reduce(lambda t, k: t[k], path, params),
    )
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, size=(2, 12)), jnp.int32)
  graphdef = abstract_model(new)[0]
  for block, (x, y) in zip(KEEP, moe_io(graphdef, new_params, new_rest, tokens)):
    expected = numpy_moe(
      np.asarray(x),
      params["blocks"][block]["ffn"],
      KEEP[block],
      config.model.moe.top_k,
      None if scales is None else scales[block],
    )
    np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


def test_keeping_every_expert_changes_nothing(tiny_model):
  config, _, state = tiny_model
  params, rest = host(state.params), host(state.rest)
  new, new_params, _ = surgery.remove_experts(
    config.model, params, rest, {0: range(8), 1: range(8)}
  )
  assert new.moe.num_experts == 8 and not new.moe.expert_counts
  jax.tree.map(np.testing.assert_array_equal, new_params, params)


def test_router_state_is_cut_along_its_expert_axis(tiny_config):
  config = tiny_config("router=sigmoid_bias")
  _, state, _ = init_state(config)
  params, rest = host(state.params), host(state.rest)
  rest["blocks"][0]["ffn"]["router_state"]["bias"] = np.arange(8, dtype=np.float32)
  _, _, new_rest = surgery.remove_experts(config.model, params, rest, KEEP)
  np.testing.assert_array_equal(new_rest["blocks"][0]["ffn"]["router_state"]["bias"], KEEP[0])


@pytest.mark.parametrize(
  "keep,message",
  [
    ({0: [0]}, r"keep\[0\] has 1 experts, below model.moe.top_k=2"),
    ({0: [0, 0, 1]}, r"keep\[0\]=\[0, 0, 1\] must be distinct experts in \[0, 8\)"),
    ({0: [3, 8]}, r"must be distinct experts in \[0, 8\)"),
    ({5: [0, 1]}, r"keep names blocks \[5\], which are not MoE blocks \[0, 1\]"),
  ],
)
def test_bad_keep_sets_are_refused(keep, message, tiny_model):
  config, _, state = tiny_model
  params, rest = host(state.params), host(state.rest)
  with pytest.raises(ConfigError, match=message):
    surgery.remove_experts(config.model, params, rest, keep)


def test_merge_takes_the_mass_weighted_mean_of_the_merged_experts(tiny_model):
  state = tiny_model[2]
  params = host(state.params)
  mass = np.arange(1.0, 9.0)  # expert e has mass e + 1
  merged = surgery.merge_experts(params, 0, {2: 1, 5: 1, 7: 3}, mass)
  for name, w in params["blocks"][0]["ffn"]["experts"].items():
    got, w = merged["blocks"][0]["ffn"]["experts"][name], w.astype(np.float64)
    np.testing.assert_allclose(got[1], (2 * w[1] + 3 * w[2] + 6 * w[5]) / 11, atol=1e-8)
    np.testing.assert_allclose(got[3], (4 * w[3] + 8 * w[7]) / 12, atol=1e-8)
    np.testing.assert_array_equal(got[0], w[0].astype(np.float32))
    np.testing.assert_array_equal(
      merged["blocks"][1]["ffn"]["experts"][name], params["blocks"][1]["ffn"]["experts"][name]
    )
  np.testing.assert_array_equal(
    params["blocks"][0]["ffn"]["experts"]["w_up"][1],
    state.params["blocks"][0]["ffn"]["experts"]["w_up"][1],
  )  # no mutation: the model's own weights


def test_step_no_merge_keeps_steps_experts_and_only_removes_the_rest(tiny_model):
  """`step` and `step_no_merge` keep the same experts; without the merge the pruned
  params are exactly the removal, with it the kept experts absorbed the pruned."""
  from moejax.posttrain import prune
  from moejax.posttrain.calibration import Calibration

  config, _, state = tiny_model
  params, rest = host(state.params), host(state.rest)
  windows = np.random.default_rng(0).integers(0, 256, size=(8, 16)).astype(np.int32)
  calibration = Calibration(config.model, params, rest, windows)
  run = {
    method: prune.prune_model(
      config.model, params, rest, keep="4", method=method, calibration=calibration
    )
    for method in ("step", "step_no_merge")
  }
  kept = {layer["block"]: layer["kept"] for layer in run["step_no_merge"][3]}
  assert kept == {layer["block"]: layer["kept"] for layer in run["step"][3]}
  _, want, _ = surgery.remove_experts(config.model, params, rest, kept)
  jax.tree.map(np.testing.assert_array_equal, run["step_no_merge"][1], want)
  merged = run["step"][1]["blocks"][0]["ffn"]["experts"]["w_up"]
  assert not np.allclose(merged, want["blocks"][0]["ffn"]["experts"]["w_up"])


@pytest.mark.integration
def test_deployed_error_equals_a_numpy_moe_and_the_proxy_where_nothing_re_routes():
  """The deployed error (contributions.deployed_errors) on a tiny LM with top-1
  routing (gate 1 after renormalisation): keeping 5 experts by frequency with
  rescale, it is sum_t ||y'_t - y_t||^2 of the numpy MoE over
  the kept experts against the source layer. Then expert 5 is made a zero-output twin
  of expert 4 (same router column, w_down = 0): the tie goes to 4, so 5 is never
  routed; without 4 its tokens go to 5 and output 0, every other token keeps its
  expert, so the deployed error equals the proxy (both objectives, dropped
  outputs vanish with the original gates) exactly."""
  from moejax.posttrain import contributions, expert_subset, prune
  from moejax.posttrain.calibration import Calibration

  config = lm_shakespeare_moe.get_config("size=tiny,top_k=1")
  _, state, _ = init_state(config)
  params, rest = jax.tree.map(np.array, state.params), jax.tree.map(np.asarray, state.rest)
  windows = np.random.default_rng(0).integers(0, 256, size=(4, 16)).astype(np.int32)
  graphdef = abstract_model(config.model)[0]
  calibration = Calibration(config.model, params, rest, windows)
  new_m, new_params, new_rest, layers = prune.prune_model(
    config.model,
    params,
    rest,
    keep="5",
    method="frequency",
    calibration=calibration,
    rescale=True,
    deployed=True,
  )
  kept = {layer["block"]: layer["kept"] for layer in layers}
  scales = {
    b: expert_subset.rescale_weights(s.gram, kept[b]) for b, s in zip((0, 1), calibration.stats)
  }
  for block, layer in zip((0, 1), layers):
    want = 0.0
    for tokens in calibration.batches:
      x, y = [
        np.asarray(a, np.float64)
        for a in moe_io(graphdef, params, rest, jnp.asarray(tokens))[block]
      ]
      pruned = numpy_moe(x, params["blocks"][block]["ffn"], kept[block], 1, scales[block])
      want += np.sum((pruned - y) ** 2)
    gram = calibration.stats[block].gram
    np.testing.assert_allclose(layer["deployed_error"] * gram.sum(), want, rtol=1e-3)
  ffn = params["blocks"][0]["ffn"]
  ffn["router_kernel"][:, 5] = ffn["router_kernel"][:, 4]
  ffn["experts"]["w_down"][5] = 0.0
  calibration = Calibration(config.model, params, rest, windows)
  assert calibration.stats[0].frequency[5] == 0 < calibration.stats[0].frequency[4]
  keep = [0, 1, 2, 3, 5, 6, 7]  # 4 dropped, its zero-output twin kept
  choice = {0: keep, 1: range(8)}
  for objective, rescale in (("rescaled", True), ("no_rescale", False)):
    scales = (
      {0: expert_subset.rescale_weights(calibration.stats[0].gram, keep)} if rescale else None
    )
    new_m, new_params, new_rest = surgery.remove_experts(config.model, params, rest, choice, scales)
    errors = contributions.deployed_errors(
      graphdef, params, rest, new_m, new_params, new_rest, calibration.batches
    )
    proxy = expert_subset.subset_error(calibration.stats[0].gram, keep, objective)
    assert proxy > 0 and errors[1] == 0.0
    np.testing.assert_allclose(errors[0], proxy, rtol=1e-3)


def test_merge_partners_by_output_find_a_functional_twin_the_gram_cannot(tiny_model):
  """Expert 5 made a copy of expert 1's weights, with a router column that never
  sends a token to both: their routed contributions never overlap (G_15 = 0, so
  the Gram's cosine cannot pair them), but run on the same tokens their outputs
  are equal (output cosine 1): partner='output' merges 5 into 1."""
  from moejax.posttrain import prune
  from moejax.posttrain.calibration import Calibration

  config, _, state = tiny_model
  params, rest = host(state.params), host(state.rest)
  params = jax.tree.map(np.array, params)
  ffn = params["blocks"][0]["ffn"]
  for name in ffn["experts"]:
    ffn["experts"][name][5] = ffn["experts"][name][1]
  ffn["router_kernel"][:, 1] *= 100.0  # 1 first or last, 5 the reverse: never both
  ffn["router_kernel"][:, 5] = -ffn["router_kernel"][:, 1]
  windows = np.random.default_rng(0).integers(0, 256, size=(4, 16)).astype(np.int32)
  stats = Calibration(config.model, params, rest, windows).stats[0]
  kept = [0, 1, 2, 3]
  assert stats.gram[1, 5] == 0.0 and stats.frequency[1] > 0 and stats.frequency[5] > 0
  assert prune.most_similar_kept(stats.outputs, kept)[5] == 1
  assert prune.most_similar_kept(stats.gram, kept)[5] != 1
