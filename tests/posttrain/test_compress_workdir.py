"""Compression of a training workdir end to end (moejax/posttrain/compress_pipeline.py,
compress_workdir.py, expert_inputs.py, calibration.py): the calibration inputs against a brute
force, the compressed model against the float model its arrays decode to,
GEMQ's re-estimated costs, and router-only fine-tuning through the trainer."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.analysis.router_inference import captured_forward
from moejax.errors import ConfigError
from moejax.models.decoder import abstract_model
from moejax.posttrain import compress_pipeline as cp
from moejax.posttrain import compress_workdir as cw
from moejax.posttrain import expert_inputs, gemq
from moejax.posttrain import source as source_lib
from moejax.posttrain.calibration import Calibration, calibration_windows
from moejax.train.loop import train_and_evaluate
from moejax.train.restore import load_from_workdir, restore
from tests.posttrain.conftest import SOURCE_STEPS

STEPS = SOURCE_STEPS
GROUP = 16  # tiny: d_model = expert_d_ff = 32


@pytest.fixture(scope="module")
def source(tiny_source):
  return tiny_source[1]


@pytest.fixture(scope="module")
def calibrated(source):
  from moejax.data.pipeline import train_token_stream
  src = source_lib.load_training(source)
  windows = calibration_windows(train_token_stream(src.config.data), 8, 32, 0)
  calibration = Calibration(src.model, src.params, src.rest, windows)
  return src, calibration, windows


def logits(m, params, rest, tokens):
  return np.asarray(nnx.merge(abstract_model(m)[0], params, rest)(jnp.asarray(tokens))[0])


def test_captured_inputs_are_the_routed_rows_and_their_swiglu_hidden(calibrated):
  src, calibration, windows = calibrated
  model = nnx.merge(calibration.graphdef, src.params, src.rest)
  _, aux, outputs = captured_forward(model, jnp.asarray(windows))
  blocks = [i for i, b in enumerate(model.blocks) if b.is_moe]
  for layer, layer_aux in zip(calibration.inputs, aux["moe"]):
    x = np.asarray(outputs[("blocks", layer.block, "ffn_norm", "__call__")], np.float64)
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
      order = lambda a: a[np.lexsort(a.T[::-1])]
      np.testing.assert_allclose(order(got), order(want), rtol=0, atol=1e-6)
      gate = got.astype(np.float64) @ w["w_gate"][e]
      hidden = gate / (1 + np.exp(-gate)) * (got.astype(np.float64) @ w["w_up"][e])
      np.testing.assert_allclose(layer.expert_rows(e, "w_down"), hidden, rtol=1e-5,
                                 atol=1e-5 * np.abs(hidden).max())
    h = layer.hessians(w["w_gate"].shape[0])
    np.testing.assert_allclose(h["w_down"][3], hidden_of(layer, 3).T @ hidden_of(layer, 3),
                               rtol=1e-12)


def hidden_of(layer, e):
  return layer.expert_rows(e, "w_down").astype(np.float64)


@pytest.mark.parametrize("method, level", [("gemq", 2.5), ("per_layer", 3.0),
                                           ("codequant", 2.5), ("td_moe", 0.4)])
def test_the_compressed_model_equals_the_float_model_its_arrays_decode_to(
    calibrated, method, level):
  src, calibration, windows = calibrated
  r = cp.Request(method, level, group_size=GROUP)
  out = cw.run(r, src, calibration)
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
    np.testing.assert_allclose(out.float_params["blocks"][1]["ffn"]["experts"]["w_up"],
                               (codes - zeros) * scales, rtol=1e-7)
    bits = np.concatenate([np.asarray(b) for b in out.report["bits"].values()])
    assert bits.mean() <= level + 1e-9
    if method == "per_layer":
      assert all(np.mean(b) <= level + 1e-9 for b in out.report["bits"].values())
  if method == "td_moe":
    assert out.report["parameters"] <= out.report["budget"]
    assert out.report["budget"] == int(0.6 * out.report["dense_parameters"])


def test_costs_measured_on_a_model_already_at_b_bits_are_zero_at_b(calibrated):
  src, calibration, _ = calibrated
  blocks, float_costs = calibration.costs((2, 4), GROUP)
  assert np.all(float_costs > 0)
  at_two = gemq.quantized_experts(src.params, blocks, 2, GROUP)
  _, costs = calibration.costs((2, 4), GROUP, current=at_two)
  np.testing.assert_array_equal(costs[:, :, 0], 0.0)  # re-quantizing to 2 bits changes nothing
  assert np.all(costs[:, :, 1] > 0)


def test_router_finetuning_trains_only_the_routers_through_the_trainer(source, tmp_path):
  out = str(tmp_path / "gemq")
  r = cp.Request("gemq", 3.0, group_size=GROUP, seed=1)
  report = cw.compress_workdir(source, out, r, num_windows=8, finetune_steps=3,
                               finetune_lr=1e-2)
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
  from configs import workdir as workdir_config
  again = workdir_config.get_config(f"path={out}")
  again.train.steps = STEPS + 4
  run = train_and_evaluate(again, out, write_metrics=False)
  assert run.start_step == STEPS + 3 and np.isfinite(run.history[-1]["loss"])


def _calibrated_for(workdir, seed):
  from moejax.data.pipeline import train_token_stream
  src = source_lib.load_training(workdir)
  windows = calibration_windows(train_token_stream(src.config.data), 8,
                                src.config.data.seq_len, seed)
  return src, Calibration(src.model, src.params, src.rest, windows)


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
  host = lambda tree: jax.tree.map(np.asarray, tree)
  tokens = np.asarray(calibration.batches[0][:2])
  want_logits = logits(src.config.model, want.float_params, src.rest, tokens)
  np.testing.assert_allclose(logits(config.model, host(params), host(rest), tokens),
                             want_logits, rtol=0, atol=2e-5 * np.abs(want_logits).max())
  with pytest.raises(ConfigError, match="'swiglu' experts.*'codebook'"):
    cw.compress_workdir(out, None, r, num_windows=8)


def test_codebook_float_weights_are_the_centroids_the_indices_pick_rotated_back(calibrated):
  """numpy oracle of the codebook decode: w = R @ c[e, r // g, index[e, r, :]] with R
  the Hadamard matrix (the codebook approximates R^T W)."""
  from moejax.experts.codebook import hadamard
  src, calibration, _ = calibrated
  out = cw.run(cp.Request("codequant", 2.5, group_size=GROUP), src, calibration)
  experts = out.rest["blocks"][0]["ffn"]["experts"]
  for m in ("w_gate", "w_down"):
    index = np.asarray(experts[f"{m}_indices"]).astype(int)
    centroids = np.asarray(experts[f"{m}_centroids"], np.float64)
    e, d_in, _ = index.shape
    rows = np.arange(d_in) // GROUP
    decoded = centroids[np.arange(e)[:, None, None], rows[None, :, None], index]
    want = np.einsum("ab,ebo->eao", hadamard(d_in).astype(np.float64), decoded)
    np.testing.assert_allclose(out.float_params["blocks"][0]["ffn"]["experts"][m], want,
                               rtol=0, atol=1e-6 * np.abs(want).max())
  bits = np.asarray(experts["bits"])
  assert sorted(set(bits.tolist())) == [2, 3] and np.all(
      np.asarray(experts["w_up_indices"]).max(axis=(1, 2)) < 2 ** bits)
