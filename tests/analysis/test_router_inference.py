"""Inference-time router tooling on a (randomly initialised) tiny LM: teacher-forced
decoding equals the full forward, calibration captures the true MoE inputs and
finds duplicated experts, router swaps keep the weights."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.analysis import router_inference as ri
from moejax.errors import ConfigError
from moejax.models.capture import moe_layer_inputs

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


WINDOWS = np.random.default_rng(0).integers(0, 256, size=(8, 13)).astype(np.int32)


def full_forward_bpb(graphdef, params, rest, windows):
  batch = {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
  loss, _ = ri._forward(graphdef, params, rest, batch["inputs"], batch["targets"])
  return float(loss) / math.log(2)


def test_teacher_forced_decoding_equals_the_full_forward(tiny_model):
  config, graphdef, state = tiny_model
  params, rest, windows = state.params, state.rest, WINDOWS
  m = config.model
  for batch in (2, 8):  # top-k routing does not depend on the decode batch
    out = ri.decode_score(m, params, rest, windows, batch)
    assert out["bpb"] == pytest.approx(full_forward_bpb(graphdef, params, rest, windows), rel=1e-5)
    assert 1 <= out["distinct_experts"] <= min(8, 2 * batch)


def test_score_batches_reports_loss_and_top_k_load(tiny_model):
  config, graphdef, state = tiny_model
  params, rest, windows = state.params, state.rest, WINDOWS
  batch = {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
  out = ri.score_batches(graphdef, params, rest, [batch], top_k=2)
  assert out["bpb"] == pytest.approx(full_forward_bpb(graphdef, params, rest, windows), rel=1e-6)
  assert out["experts_per_token"] == pytest.approx(2.0) and out["kept_fraction"] == 1.0
  # gamma large: capacity-aware drop is top-k; gamma small: max load = C exactly.
  _, loose = ri.with_router(config, router="capacity_aware", capacity_aware=dict(gamma=100.0))
  assert ri.score_batches(loose, params, rest, [batch], 2)["bpb"] == pytest.approx(out["bpb"])
  _, tight = ri.with_router(config, router="capacity_aware", capacity_aware=dict(gamma=0.5))
  drop = ri.score_batches(tight, params, rest, [batch], 2)
  capacity = math.ceil(0.5 * 2 * windows[:, :-1].size / config.model.moe.num_experts)
  assert drop["max_load"] <= capacity + 1e-6 and drop["kept_fraction"] < 1.0


def test_calibration_captures_moe_inputs_and_finds_duplicate_experts(tiny_model):
  config, graphdef, state = tiny_model
  params, rest, windows = state.params, state.rest, WINDOWS
  from flax import nnx

  @jax.jit  # one program each, not one per operation
  def inputs_and_by_hand(params, rest, tokens):
    model = nnx.merge(graphdef, params, rest)
    # Oracle for the first layer's input: ffn_norm(x + attn(attn_norm(x))) by hand.
    block, x = model.blocks[0], model.embed[...][tokens]
    positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
    causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))[None]
    attended, _ = block.attn(block.attn_norm(x), positions, causal)
    return moe_layer_inputs(model, tokens), block.ffn_norm(x + attended)

  inputs, by_hand = inputs_and_by_hand(params, rest, jnp.asarray(windows[:, :-1]))
  assert len(inputs) == config.model.num_layers
  np.testing.assert_allclose(
    inputs[0], by_hand.reshape(-1, by_hand.shape[-1]), rtol=1e-6, atol=1e-6
  )
  # Make expert 3 a copy of expert 1 in every layer: CKA(1, 3) = 1, others < 1.
  params = jax.tree.map(lambda v: v, params)
  for block_params in params["blocks"].values():
    for name in ("w_gate", "w_up", "w_down"):
      w = block_params["ffn"]["experts"][name]
      block_params["ffn"]["experts"][name] = w.at[3].set(w[1])
  sim = np.asarray(ri.calibrate_similarity(graphdef, params, rest, jnp.asarray(windows)))
  assert sim.shape == (config.model.num_layers, 8, 8)
  np.testing.assert_allclose(sim[:, 1, 3], 1.0, rtol=1e-5)
  np.testing.assert_allclose(sim, np.swapaxes(sim, 1, 2), atol=1e-6)
  np.testing.assert_allclose(np.diagonal(sim, axis1=1, axis2=2), 1.0, rtol=1e-5)
  off = sim[:, ~np.eye(8, dtype=bool)]
  assert np.sum(off > 1 - 1e-4) == 2 * config.model.num_layers  # (1,3) and (3,1) only


def test_set_router_state_writes_each_layer_and_checks_the_count():
  eye = np.eye(2, dtype=np.float32)
  rest = {"layers": {i: {"moe": {"expert_similarity": eye}} for i in (0, 2, 10)}}
  rest["layers"][1] = {"attn": {}}
  values = [np.full((2, 2), v, np.float32) for v in (0.1, 0.2, 0.3)]
  out = ri.set_router_state(rest, "expert_similarity", values)
  for layer, v in zip((0, 2, 10), (0.1, 0.2, 0.3)):  # numeric layer order, not "10" < "2"
    assert float(out["layers"][layer]["moe"]["expert_similarity"][0, 1]) == pytest.approx(v)
  assert float(rest["layers"][0]["moe"]["expert_similarity"][0, 1]) == 0.0  # copy
  with pytest.raises(ConfigError, match="3 router states"):
    ri.set_router_state(rest, "expert_similarity", [eye])
  with pytest.raises(ConfigError, match=r"shape \(2, 2\); the value given has \(3, 3\)"):
    ri.set_router_state(rest, "expert_similarity", [np.eye(3)] * 3)


def test_sere_decoding_with_a_threshold_above_every_similarity_is_top_k(tiny_model):
  config, graphdef, state = tiny_model
  params, rest, windows = state.params, state.rest, WINDOWS
  m = config.model
  similarity = ri.calibrate_similarity(graphdef, params, rest, jnp.asarray(windows))
  plain = ri.decode_score(m, params, rest, windows, 8)
  m_off, rest_off = ri.with_sere(m, rest, similarity, rho=1.5)
  assert ri.decode_score(m_off, params, rest_off, windows, 8) == plain
  m_on, rest_on = ri.with_sere(m, rest, similarity, rho=0.0)
  rerouted = ri.decode_score(m_on, params, rest_on, windows, 8)
  assert rerouted["distinct_experts"] < plain["distinct_experts"]


# ---- the three studies (moejax/studies/scorers/router_inference.py) ----------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """Step 0 of the tiny default MoE (Shakespeare plays, 8 x 32 bytes per batch)."""
  from tests.helpers import training_workdir

  path = str(tmp_path_factory.mktemp("ri") / "w")
  training_workdir(path)
  return path


def study(name, workdir, **changes):
  from moejax.train.sweep import load_config_file

  c = load_config_file(f"configs/studies/router_inference_{name}.py")
  c.settings.workdir = workdir
  for key, value in changes.items():
    if key == "settings":
      c.settings.update(value)
    else:
      c[key] = value
  if "levels" in changes:  # claims at a level the study no longer has
    c.claims = [claim for claim in c.claims if "at" not in claim]
  return c


def run_study(config, tmp_path):
  from moejax.studies import runner

  spec, scorer = runner.prepare(config)
  return runner.run(spec, scorer, str(tmp_path / "out"), plot=False, log=lambda _: None)


def by_arm(results):
  return {(r["arm"], tuple(r["level"].values()), r["draw"]): r["metrics"] for r in results["runs"]}


@pytest.mark.integration
def test_capacity_study_scores_validation_batch_d_on_draw_d(workdir, tmp_path):
  from moejax.analysis.router_inference import TrainedMoE

  results = run_study(
    study("capacity", workdir, draws=2, levels=[{"gamma": 0.5}, {"gamma": 100.0}]), tmp_path
  )
  runs = by_arm(results)
  m = TrainedMoE(workdir)
  batches = m.eval_batches()
  capacity = math.ceil(0.5 * 2 * batches[0]["inputs"].size / 8)
  for draw in (0, 1):
    plain = ri.score_batches(ri.with_router(m.config)[1], m.params, m.rest, [batches[draw]], 2)
    _, drop = ri.with_router(
      m.config, router="capacity_aware", capacity_aware=dict(gamma=0.5, expand_r=1.0)
    )
    tight = ri.score_batches(drop, m.params, m.rest, [batches[draw]], 2)
    for gamma in (0.5, 100.0):
      assert runs[("top_k", (gamma,), draw)] == plain  # the model's router ignores gamma
    assert runs[("token_drop", (0.5,), draw)] == tight
    assert tight["max_load"] <= capacity + 1e-6 < plain["max_load"]
    # gamma = 100: nothing is over capacity, both drop rules are top-k
    for arm in ("token_drop", "expanded_drop"):
      assert runs[(arm, (100.0,), draw)]["bpb"] == pytest.approx(plain["bpb"], rel=1e-6)
  assert runs[("top_k", (0.5,), 0)] != runs[("top_k", (0.5,), 1)]
  (row,) = [
    r for r in results["claims"] if r["metric"] == "max_load" and r["level"] == {"gamma": 0.5}
  ]
  assert (
    row["interval"]["mean"]
    == pytest.approx(
      np.mean(
        [
          runs[("token_drop", (0.5,), d)]["max_load"] - runs[("top_k", (0.5,), d)]["max_load"]
          for d in (0, 1)
        ]
      )
    )
    and row["interval"]["mean"] < 0
  )


@pytest.mark.integration
def test_as_coot_study_scores_held_out_play_d_on_draw_d(workdir, tmp_path):
  from moejax.analysis.router_inference import TrainedMoE
  from moejax.data.shakespeare import shakespeare_sources

  results = run_study(study("as_coot", workdir, draws=2, settings={"play_batches": 1}), tmp_path)
  runs = by_arm(results)
  m = TrainedMoE(workdir)
  plays = list(shakespeare_sources(m.config.data.data_dir)["validation"])
  for draw in (0, 1):  # one batch of 8 consecutive 32-byte windows of the play, by hand
    tokens = np.frombuffer(plays[draw]["text"], np.uint8)[: 8 * 33].astype(np.int32)
    windows = tokens.reshape(8, 33)
    batch = {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
    for arm, keys in (
      ("top_k", {}),
      ("as_coot_inf", dict(router="as_coot", as_coot=dict(tau=0.0))),
    ):
      expect = ri.score_batches(ri.with_router(m.config, **keys)[1], m.params, m.rest, [batch], 2)
      assert runs[(arm, (), draw)] == {k: expect[k] for k in runs[(arm, (), draw)]}
  assert "Draw d is held-out play d: 0 " in open(tmp_path / "out" / "results.md").read()


@pytest.mark.integration
def test_sere_study_decodes_windows_of_draw_d(workdir, tmp_path):
  from moejax.analysis.router_inference import TrainedMoE
  from moejax.train.load import from_training_workdir

  config = study(
    "sere",
    workdir,
    draws=2,
    levels=[{"batch": 4, "rho": 1.0}, {"batch": 4, "rho": 0.0}],
    settings={"windows_per_draw": 4, "decode_len": 6, "calibration_batches": 1},
  )
  runs = by_arm(run_study(config, tmp_path))
  m = TrainedMoE(workdir)
  loaded = from_training_workdir(workdir)[0]
  windows = np.concatenate(
    [np.concatenate([b["inputs"], b["targets"][:, -1:]], 1) for b in m.eval_batches()]
  )
  for draw in (0, 1):
    rows = windows[4 * draw : 4 * draw + 4, :7]
    plain = ri.decode_score(loaded.config, loaded.params, loaded.rest, rows, 4)
    assert runs[("top_k", (4, 1.0), draw)] == runs[("top_k", (4, 0.0), draw)] == plain
    # rho = 1: only a copy of an expert is that similar, so SERE re-routes nothing
    assert runs[("sere", (4, 1.0), draw)] == plain
    assert runs[("sere", (4, 0.0), draw)]["distinct_experts"] < plain["distinct_experts"]


@pytest.mark.parametrize(
  "name,changes,message",
  [
    (
      "capacity",
      dict(settings={"workdir": "/nonexistent"}),
      r"study\.settings\.workdir='/nonexistent' is not a training workdir",
    ),
    ("capacity", dict(draws=10**6), r"study\.draws=1000000: the model's data has \d+ validation"),
    ("capacity", dict(levels=[{"gamma": 0.0}]), r"study\.levels\[0\]\.gamma=0\.0 must be > 0"),
    ("capacity", dict(levels=[{"rho": 1.0}]), r"study\.levels have axes \['rho'\]"),
    ("as_coot", dict(draws=9), r"study\.draws=9: the model's data has 4 held-out plays"),
    ("as_coot", dict(settings={"play_batches": 0}), r"study\.settings\.play_batches=0"),
    (
      "sere",
      dict(levels=[{"batch": 65, "rho": 0.5}]),
      r"study\.levels\[0\]\.batch=65 must be an integer in \[1, "
      r"study\.settings\.windows_per_draw=64\]",
    ),
    ("sere", dict(levels=[{"batch": 8, "rho": 1.5}]), r"study\.levels\[0\]\.rho=1\.5"),
  ],
)
def test_router_studies_refuse_bad_input_before_any_run(workdir, tmp_path, name, changes, message):
  with pytest.raises(ConfigError, match=message):
    run_study(study(name, workdir, **changes), tmp_path)
  assert not (tmp_path / "out").exists()


def test_router_studies_refuse_a_dense_model(tmp_path):
  from moejax.configs.lm_shakespeare_dense import get_config as dense_config
  from tests.helpers import training_workdir

  training_workdir(str(tmp_path / "dense"), dense_config("size=tiny"))
  with pytest.raises(ConfigError, match=r"model\.ffn_type='dense'.*study\.settings\.workdir="):
    run_study(study("capacity", str(tmp_path / "dense")), tmp_path)


def test_decode_windows_are_the_validation_stream_and_refuse_one_token_too_many(workdir):
  """Window i is validation row i's inputs followed by its last target (seq_len + 1
  tokens); asking for seq_len + 1 tokens of prediction is one too many."""
  trained = ri.TrainedMoE(workdir)
  seq_len = trained.config.data.seq_len
  first = trained.eval_batches()[0]
  want = np.concatenate([first["inputs"][:2], first["targets"][:2, -1:]], 1)
  np.testing.assert_array_equal(trained.decode_windows(0, 2, seq_len), want)
  np.testing.assert_array_equal(trained.decode_windows(1, 1, 3), first["inputs"][1:2, :4])
  with pytest.raises(
    ConfigError, match=f"of {seq_len} tokens; asked for windows 0..0 of {seq_len + 1} tokens"
  ):
    trained.decode_windows(0, 1, seq_len + 1)
