"""Compression of a training workdir end to end (moejax/posttrain/compress_pipeline.py,
compress_workdir.py, expert_inputs.py, calibration.py): the calibration inputs against a brute
force, the compressed model against the float model its arrays decode to,
GEMQ's re-estimated costs, and router-only fine-tuning through the trainer."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.errors import ConfigError
from moejax.models.capture import captured_forward
from moejax.models.decoder import abstract_model
from moejax.posttrain import compress_pipeline as cp
from moejax.posttrain import compress_workdir as cw
from moejax.posttrain import gemq
from moejax.posttrain import source as source_lib
from moejax.posttrain.calibration import Calibration, calibration_windows
from moejax.train.loop import train_and_evaluate
from moejax.train.restore import load_from_workdir, restore
from tests.helpers import TINY_WORKDIR_STEPS as STEPS

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

GROUP = 16  # tiny: d_model = expert_d_ff = 32


@pytest.fixture(scope="module")
def source(tiny_workdir):
  return tiny_workdir[1]


@pytest.fixture(scope="module")
def calibrated(source):
  from moejax.data.pipeline import train_token_stream

  src = source_lib.load_training(source)
  windows = calibration_windows(train_token_stream(src.config.data), 8, 32, 0)
  calibration = Calibration(src.model, src.params, src.rest, windows)
  return src, calibration, windows


@pytest.fixture(scope="module")
def compressed(calibrated):
  """compressed(method, level): cw.run of the calibrated source at group GROUP, run
  once per module (the decode tests below read the same results)."""
  src, calibration, _ = calibrated
  made = {}

  def get(method, level):
    if (method, level) not in made:
      made[method, level] = cw.run(cp.Request(method, level, group_size=GROUP), src, calibration)
    return made[method, level]

  return get


def logits(m, params, rest, tokens):
  return np.asarray(_forward(abstract_model(m)[0], params, rest, jnp.asarray(tokens)))


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, params, rest, tokens):  # one program per model, not one per op
  return nnx.merge(graphdef, params, rest)(tokens)[0]


def test_captured_inputs_are_the_routed_rows_and_their_swiglu_hidden(calibrated):
  src, calibration, windows = calibrated
  model = nnx.merge(calibration.graphdef, src.params, src.rest)
  blocks = [i for i, b in enumerate(model.blocks) if b.is_moe]

  @jax.jit
  def capture(params, rest, tokens):  # the MoE blocks' inputs, as the layers saw them
    _, aux, outputs = captured_forward(nnx.merge(calibration.graphdef, params, rest), tokens)
    return aux, [outputs[("blocks", block, "ffn_norm", "__call__")] for block in blocks]

  aux, normed = capture(src.params, src.rest, jnp.asarray(windows))
  for layer, layer_aux in zip(calibration.inputs, aux["moe"]):
    x = np.asarray(normed[blocks.index(layer.block)], np.float64)
    x = x.reshape(-1, x.shape[-1])
    index = np.asarray(layer_aux["expert_index"]).reshape(len(x), -1)
    valid = np.asarray(layer_aux["valid"]).reshape(index.shape)
    w = cp.expert_weights(src.params, layer.block)
    assert layer.block in blocks
    np.testing.assert_allclose(layer.inputs, x, rtol=0, atol=1e-6)
    for e in range(w["w_gate"].shape[0]):
      want = x[np.any((index == e) & valid, axis=1)]  # every token routed to e, once
      got = layer.expert_rows(e, "w_gate")
      assert len(got) == len(want)
      np.testing.assert_allclose(sorted_rows(got), sorted_rows(want), rtol=0, atol=1e-6)
      gate = got.astype(np.float64) @ w["w_gate"][e]
      hidden = gate / (1 + np.exp(-gate)) * (got.astype(np.float64) @ w["w_up"][e])
      np.testing.assert_allclose(
        layer.expert_rows(e, "w_down"), hidden, rtol=1e-5, atol=1e-5 * np.abs(hidden).max()
      )
    h = layer.hessians(w["w_gate"].shape[0])
    np.testing.assert_allclose(
      h["w_down"][3], hidden_of(layer, 3).T @ hidden_of(layer, 3), rtol=1e-12
    )


def sorted_rows(a):
  return a[np.lexsort(a.T[::-1])]


def hidden_of(layer, e):
  return layer.expert_rows(e, "w_down").astype(np.float64)


@pytest.mark.integration
@pytest.mark.parametrize(
  "method, level", [("gemq", 2.5), ("per_layer", 3.0), ("codequant", 2.5), ("td_moe", 0.4)]
)
def test_the_compressed_model_equals_the_float_model_its_arrays_decode_to(
  calibrated, compressed, method, level
):
  src, _, windows = calibrated
  out = compressed(method, level)
  m = src.config.model
  got = logits(out.model, out.params, out.rest, windows[:2])
  want = logits(m, out.float_params, src.rest, windows[:2])
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
  original = logits(m, src.params, src.rest, windows[:2])
  assert np.abs(original - want).max() > 1e-3  # the experts did change
  if method in ("gemq", "per_layer"):  # the float model holds (code - zero) * scale
    arrays = out.rest["blocks"][1]["ffn"]["experts"]
    codes, zeros = (np.asarray(arrays[f"w_up_{k}"], np.float64) for k in ("codes", "zeros"))
    scales = np.repeat(np.asarray(arrays["w_up_scales"], np.float64), GROUP, axis=1)
    zeros = np.repeat(zeros, GROUP, axis=1)
    np.testing.assert_allclose(
      out.float_params["blocks"][1]["ffn"]["experts"]["w_up"], (codes - zeros) * scales, rtol=1e-7
    )
    bits = np.concatenate([np.asarray(b) for b in out.report["bits"].values()])
    assert bits.mean() <= level + 1e-9
    if method == "per_layer":
      assert all(np.mean(b) <= level + 1e-9 for b in out.report["bits"].values())
  if method == "td_moe":
    assert out.report["parameters"] <= out.report["budget"] <= 0.6 * out.report["dense_parameters"]


def test_every_factorisation_keeps_each_tensors_share_within_one_rank(calibrated):
  """TD-MoE allocates per tensor: at 40% removed every stacked projection of every
  layer keeps at most 60% of its dense parameters, and TD-MoE, plain Tucker and
  both per-expert SVDs keep equal parameters per tensor within one rank's worth
  (each is maximal within the tensor's budget: one more rank would not fit). The
  old single budget gave some tensors far more than their share."""
  from moejax.posttrain import tucker

  src, calibration, _ = calibrated
  reports = {
    m: cp.compress_experts(cp.Request(m, 0.4), src.params, calibration).report
    for m in ("td_moe", "tucker", "svd", "whitened_svd")
  }
  for block, budgets in reports["svd"]["tensor_budgets"].items():
    for m, budget in budgets.items():
      shape = cp.expert_weights(src.params, block)[m].shape
      assert budget == int(0.6 * np.prod(shape))
      svd_rank = tucker.svd_parameters(shape, 1)
      kept, step = {}, {}
      for method, report in reports.items():
        kept[method] = n = report["tensor_parameters"][block][m]
        assert n <= budget, (method, block, m)
        if method in ("svd", "whitened_svd"):
          step[method] = svd_rank
        else:
          ranks = report["ranks"][block][m]
          step[method] = min(
            tucker.tucker_parameters(shape, [r + (k == i) for k, r in enumerate(ranks)]) - n
            for i in range(3)
            if ranks[i] < shape[i]
          )
        assert budget - n < step[method], (method, block, m)  # one more rank: over
      for method in reports:  # equal parameters per tensor, within one rank's worth
        assert abs(kept[method] - kept["svd"]) < max(step[method], svd_rank), (method, m)


def test_td_moe_whitens_the_input_and_the_output_mode(calibrated):
  """The td_moe factors are factorise_experts' with output samples = each
  projection's outputs on its routed inputs (a brute force per expert), whose
  Tucker error of the doubly whitened tensor (S_in^T W R_out) is HOOI's."""
  from moejax.posttrain import factorise

  src, calibration, _ = calibrated
  layer = calibration.inputs[0]
  w = cp.expert_weights(src.params, layer.block)
  outputs = factorise.routed_outputs(w, layer.rows, layer.hidden, layer.expert)
  for m in ("w_gate", "w_down"):
    want = np.concatenate(
      [layer.expert_rows(e, m).astype(np.float64) @ w[m][e] for e in range(len(w[m]))]
    )
    np.testing.assert_allclose(outputs[m], want, rtol=1e-10)
  out = cp.compress_experts(cp.Request("td_moe", 0.4), src.params, calibration)
  ranks = {m: tuple(out.report["ranks"][layer.block][m]) for m in ("w_gate", "w_up", "w_down")}
  factors, _ = factorise.factorise_experts(
    w, layer.inputs, ranks, hidden_inputs=layer.hidden, output_samples=outputs
  )
  input_only, _ = factorise.factorise_experts(w, layer.inputs, ranks, hidden_inputs=layer.hidden)
  for m in ranks:
    np.testing.assert_array_equal(out.arrays[layer.block][m]["core"], factors[m]["core"])
    assert not np.allclose(factors[m]["output_factor"], input_only[m]["output_factor"])


def test_reestimated_costs_are_against_the_float_experts_on_the_current_model(calibrated):
  """On a model already at 2 bits, expert e's cost at b is the Fisher-weighted change
  g (E^b(x) - E(x)) of the FLOAT expert's output, on the current model's inputs,
  routing and gradients (a brute force: each block's float expert contributions
  recomputed by hand); the current allocation does not cost 0 (it did when the
  costs were measured against the current quantized experts)."""
  from moejax.posttrain.taylor import token_gradients

  src, calibration, windows = calibrated
  blocks, float_costs = calibration.costs((2, 4), GROUP)
  assert np.all(float_costs > 0)
  at_two = gemq.quantized_experts(src.params, blocks, 2, GROUP)
  _, costs = calibration.costs((2, 4), GROUP, current=at_two)
  assert np.all(costs[:, :, 0] > 0) and np.all(costs[:, :, 0] > costs[:, :, 1])
  graphdef = calibration.graphdef
  want = np.zeros_like(costs)
  for tokens in calibration.batches:
    dy, moe, loss = jax.jit(token_gradients, static_argnums=0)(
      graphdef, at_two, src.rest, jnp.asarray(tokens)
    )
    n = loss.shape[0]
    for i, block in enumerate(blocks):
      x, aux = moe[block]
      w = cp.expert_weights(src.params, block)
      for j, b in enumerate((2, 4)):
        for e in range(w["w_gate"].shape[0]):

          def out(weights):
            h = np.asarray(x, np.float64)
            gate = h @ weights["w_gate"][e]
            return (gate / (1 + np.exp(-gate)) * (h @ weights["w_up"][e])) @ weights["w_down"][e]

          q = {m: w[m].copy() for m in gemq.EXPERT_WEIGHTS}
          for m in gemq.EXPERT_WEIGHTS:
            q[m][e] = gemq.quantize.dequantize(gemq.quantize.rtn(w[m][e], b, GROUP))
          index = np.asarray(aux["expert_index"]).reshape(len(x), -1)
          weight = np.where(
            np.asarray(aux["valid"]).reshape(index.shape),
            np.asarray(aux["combine_weight"]).reshape(index.shape),
            0.0,
          )
          g = np.sum(np.where(index == e, weight, 0.0), axis=1)[:, None]
          delta = g * (out(q) - out(w))
          want[i, e, j] += np.sum(
            np.square(n * np.asarray(dy[block], np.float64)) * np.square(delta)
          )
  np.testing.assert_allclose(costs, want, rtol=2e-3)


def test_the_progressive_rounds_lower_the_budget_and_change_the_allocation(calibrated):
  """GEMQ's progressive bit reduction: 3 rounds to 2.5 bits allocate at 3.5, 3 and 2.5
  bits, each round's allocation within its budget and different from the round
  before (the old loop, costs against the current quantized model, repeated it)."""
  src, calibration, _ = calibrated
  assert cw.budgets(2.0, 3, 0.5, 8) == [3.0, 2.5, 2.0]
  assert cw.budgets(7.5, 3, 0.5, 8) == [8, 8.0, 7.5]
  out = cw.run(
    cp.Request("gemq", 2.5, quantizer="rtn", group_size=GROUP),
    src,
    calibration,
    rounds=3,
    log=lambda *_: None,
  )
  rounds = out.report["rounds"]
  assert [x["budget"] for x in rounds] == [3.5, 3.0, 2.5]
  for x in rounds:
    assert x["average_bits"] <= x["budget"] + 1e-9
  flat = [np.concatenate([np.asarray(b) for b in x["bits"].values()]) for x in rounds]
  assert all(not np.array_equal(a, b) for a, b in zip(flat, flat[1:]))
  assert out.report["average_bits"] == rounds[-1]["average_bits"]


def test_router_finetuning_uses_the_lm_loss_alone_by_default(source):
  """GEMQ's official code fine-tunes the routers on the LM loss alone: the fine-tune
  config's aux-loss weights are 0 and the aux-loss-free bias is fixed; with
  aux_losses they are the model's own."""
  config = source_lib.training_config(source)[0]
  assert all(w > 0 for w in config.model.moe.loss_weights.values())
  c = cp.router_finetune_config(config, 3)
  assert dict(c.model.moe.loss_weights) == {k: 0.0 for k in config.model.moe.loss_weights}
  assert c.model.moe.routing.bias_update_rate == 0.0
  on = cp.router_finetune_config(config, 3, aux_losses=True)
  assert dict(on.model.moe.loss_weights) == dict(config.model.moe.loss_weights)
  assert on.model.moe.routing.bias_update_rate == config.model.moe.routing.bias_update_rate
  assert (
    config.model.moe.loss_weights == source_lib.training_config(source)[0].model.moe.loss_weights
  )


@pytest.mark.integration
def test_router_finetuning_trains_only_the_routers_through_the_trainer(source, tmp_path):
  out = str(tmp_path / "gemq")
  r = cp.Request("gemq", 3.0, group_size=GROUP, seed=1)
  report = cw.compress_workdir(source, out, r, num_windows=8, finetune_steps=3, finetune_lr=1e-2)
  assert report["step"] == STEPS + 3
  tuned = restore(out)
  config = tuned.config
  assert tuned.step == STEPS + 3 and config.train.trainable == "router"
  assert config.model.moe.experts == "quantized"
  untuned = cw.run(r, *_calibrated_for(source, r.seed))
  changed = []
  for path, value in jax.tree_util.tree_flatten_with_path(tuned.params)[0]:
    before = _at(untuned.params, path)
    name = jax.tree_util.keystr(path)
    if "router" in name:
      changed.append(not np.array_equal(value, before))
    else:
      np.testing.assert_array_equal(value, before, err_msg=name)
  assert changed and all(changed)
  for path, value in jax.tree_util.tree_flatten_with_path(tuned.rest)[0]:
    np.testing.assert_array_equal(value, _at(untuned.rest, path))  # codes never trained
  # experiments.train continues it with the workdir's own config (configs/workdir.py)
  from moejax.configs import workdir as workdir_config

  again = workdir_config.get_config(f"path={out}")
  again.train.steps = STEPS + 4
  run = train_and_evaluate(again, out, write_metrics=False)
  assert run.start_step == STEPS + 3 and np.isfinite(run.history[-1]["loss"])


def _calibrated_for(workdir, seed):
  from moejax.data.pipeline import train_token_stream

  src = source_lib.load_training(workdir)
  windows = calibration_windows(
    train_token_stream(src.config.data), 8, src.config.data.seq_len, seed
  )
  return src, Calibration(src.model, src.params, src.rest, windows)


def host(tree):
  return jax.tree.map(np.asarray, tree)


def _at(tree, path):
  for key in path:
    tree = tree[getattr(key, "key", getattr(key, "idx", key))]
  return np.asarray(tree)


def test_a_compressed_workdir_restores_exactly_what_was_compressed(source, tmp_path):
  """The saved codebook workdir holds the arrays compress_experts made from the same
  calibration windows (bit for bit), its model computes what those arrays decode to,
  and compressing it again is refused (its experts are no longer float)."""
  out = str(tmp_path / "codebook")
  r = cp.Request("kmeans", 3.0, group_size=GROUP)
  cw.compress_workdir(source, out, r, num_windows=8)
  config, _, params, rest, _ = load_from_workdir(out)
  assert config.model.moe.experts == "codebook"
  src, calibration = _calibrated_for(source, r.seed)
  want = cw.run(r, src, calibration)
  for block, arrays in want.rest["blocks"].items():
    if "experts" not in arrays.get("ffn", {}):
      continue
    for name, value in arrays["ffn"]["experts"].items():
      got = np.asarray(rest["blocks"][block]["ffn"]["experts"][name])
      assert got.dtype == np.asarray(value).dtype
      np.testing.assert_array_equal(got, value, err_msg=f"block {block} {name}")
  tokens = np.asarray(calibration.batches[0][:2])
  want_logits = logits(src.config.model, want.float_params, src.rest, tokens)
  np.testing.assert_allclose(
    logits(config.model, host(params), host(rest), tokens),
    want_logits,
    rtol=0,
    atol=2e-5 * np.abs(want_logits).max(),
  )
  with pytest.raises(ConfigError, match="'swiglu' experts.*'codebook'"):
    cw.compress_workdir(out, None, r, num_windows=8)


def test_codebook_float_weights_are_the_centroids_the_indices_pick_rotated_back(compressed):
  """numpy oracle of the codebook decode: w = R @ c[e, r // g, index[e, r, :]] with R
  the Hadamard matrix (the codebook approximates R^T W)."""
  from moejax.experts.codebook import hadamard

  out = compressed("codequant", 2.5)
  experts = out.rest["blocks"][0]["ffn"]["experts"]
  for m in ("w_gate", "w_down"):
    index = np.asarray(experts[f"{m}_indices"]).astype(int)
    centroids = np.asarray(experts[f"{m}_centroids"], np.float64)
    e, d_in, _ = index.shape
    rows = np.arange(d_in) // GROUP
    decoded = centroids[np.arange(e)[:, None, None], rows[None, :, None], index]
    want = np.einsum("ab,ebo->eao", hadamard(d_in).astype(np.float64), decoded)
    np.testing.assert_allclose(
      out.float_params["blocks"][0]["ffn"]["experts"][m],
      want,
      rtol=0,
      atol=1e-6 * np.abs(want).max(),
    )
  bits = np.asarray(experts["bits"])
  assert sorted(set(bits.tolist())) == [2, 3] and np.all(
    np.asarray(experts["w_up_indices"]).max(axis=(1, 2)) < 2**bits
  )
