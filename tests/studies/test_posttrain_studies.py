"""The pruning and compression studies (moejax/studies/scorers/pruning.py and
compression.py) on the tiny trained LM: each run's figures equal the library
calls they stand for (calibration windows of seed d, prune_model / compress, the
harness), claims equal the paired t-interval by hand, a draw's figures do not
depend on the draws run before it, the fine-tuned control is each fine-tuned arm's
matched reference, and bad settings are refused naming their key before any run."""

import jax
import numpy as np
import pytest
import scipy.stats

from moejax.configs.studies import codequant as codequant_study
from moejax.configs.studies import gemq as gemq_study
from moejax.configs.studies import pruning as pruning_study
from moejax.configs.studies import td_moe as td_moe_study
from moejax.errors import ConfigError
from moejax.studies import runner
from moejax.studies.scoring import digest
from moejax.studies.spec import grid

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

GROUP = 16  # tiny: d_model = expert_d_ff = 32


def configure(config, workdir, arms, levels, draws=2, claims=None, **settings):
  config.settings.workdir = workdir
  config.settings.num_windows = 8
  config.settings.bytes_per_domain = 512
  for key, value in settings.items():
    config.settings[key] = value
  config.arms = arms
  config.levels = levels
  config.draws = draws
  names = {arm["name"] for arm in arms}
  if config.reference not in names:
    config.reference = arms[0]["name"]
  config.claims = (
    claims
    if claims is not None
    else [
      c
      for c in config.claims
      if c["arm"] in names and c["reference"] in names and ("at" not in c or c["at"] in levels)
    ]
  )
  return config


def run(config, out):
  spec, scorer = runner.prepare(config)
  return runner.run(spec, scorer, str(out), plot=False, log=lambda _: None), scorer


def by_key(results):
  return {(r["arm"], tuple(r["level"].values())[0], r["draw"]): r for r in results["runs"]}


@pytest.mark.integration
def test_pruning_runs_are_the_library_calls_they_stand_for(tiny_workdir, tmp_path):
  from moejax.models.structure import expert_counts
  from moejax.data.pipeline import split_documents, train_token_stream
  from moejax.evaluation import harness
  from moejax.evaluation.model import DecoderLM
  from moejax.posttrain import prune, source
  from moejax.posttrain.calibration import calibration_windows
  from moejax.posttrain.measure import expert_parameters

  config, workdir = tiny_workdir
  arms = [
    {"name": n, "method": m}
    for n, m in (
      ("unpruned", "none"),
      ("schur_astar", "schur_astar"),
      ("frequency", "frequency"),
      ("random", "random"),
      ("heapr", "heapr"),
    )
  ]
  results, _ = run(
    configure(pruning_study.get_config(), workdir, arms, grid(("keep", ["0.5"]))), tmp_path / "out"
  )
  runs = by_key(results)
  src = source.load_training(workdir)
  stream = train_token_stream(config.data)
  documents = harness.sample_documents(split_documents(config.data), 512)
  settings = harness.Settings(context=config.data.seq_len, probes=(), probe_count=16)
  for draw in (0, 1):
    windows = calibration_windows(stream, 8, config.data.seq_len, seed=draw)
    assert runs[("schur_astar", "0.5", draw)]["pairing"] == digest(windows)
    for method in ("schur_astar", "random"):
      m, params, rest, _ = prune.prune_model(
        src.model, src.params, src.rest, windows, keep="0.5", method=method, seed=draw
      )
      want = harness.evaluate(
        DecoderLM(m, params, rest),
        src.tokenizer,
        src.tokenizer.eos_id,
        documents,
        settings,
        expert_counts(m),
      ).report["bpb"]
      got = runs[(method, "0.5", draw)]["metrics"]
      assert got["bpb"] == want["all"] and got["bpb/shakespeare"] == want["shakespeare"]
      assert got["parameter_bytes"] == sum(np.asarray(x).nbytes for x in jax.tree.leaves(params))
      assert got["kept_experts"] == 8  # 4 of 8 in each of 2 layers
    heapr = runs[("heapr", "0.5", draw)]["metrics"]
    assert heapr["expert_parameters"] == expert_parameters(src.params) / 2
    assert "kept_experts" not in heapr  # an atom method keeps every expert, narrower
    assert "proxy_error" not in heapr and heapr["layer_error"] > 0
    _, _, _, layers = prune.prune_model(
      src.model, src.params, src.rest, windows, keep="0.5", method="schur_astar", deployed=True
    )
    got = runs[("schur_astar", "0.5", draw)]["metrics"]
    assert got["layer_error"] == np.mean([layer["deployed_error"] for layer in layers])
    assert got["proxy_error"] == np.mean([layer["relative_error"] for layer in layers])
  assert runs[("unpruned", "0.5", 0)]["metrics"] == runs[("unpruned", "0.5", 1)]["metrics"]
  assert runs[("random", "0.5", 0)]["pairing"] != runs[("random", "0.5", 1)]["pairing"]
  # the claim: schur_astar - frequency paired by draw, t-interval with 1 degree of freedom
  d = [
    runs[("schur_astar", "0.5", k)]["metrics"]["bpb"]
    - runs[("frequency", "0.5", k)]["metrics"]["bpb"]
    for k in (0, 1)
  ]
  row = next(r for r in results["claims"] if r["reference"] == "frequency")
  half = scipy.stats.t.ppf(0.975, 1) * np.std(d, ddof=1) / np.sqrt(2)
  assert row["interval"]["mean"] == pytest.approx(np.mean(d), abs=1e-15)
  assert row["interval"]["hi"] == pytest.approx(np.mean(d) + half, rel=1e-9)


@pytest.mark.integration
def test_a_draws_figures_do_not_depend_on_the_draws_before_it(tiny_workdir, tmp_path):
  """td_moe at 40% removed: the study's draw 1 equals a fresh scorer asked for draw 1
  alone; per-expert SVD is calibration-free (the same on both draws), TD-MoE is not;
  both keep at most the budget, 60% of the fp32 model's expert parameters."""
  _, workdir = tiny_workdir
  arms = [
    {"name": "fp32", "method": "none"},
    {"name": "svd", "method": "svd"},
    {"name": "td_moe", "method": "td_moe"},
  ]
  config = configure(
    td_moe_study.get_config(), workdir, arms, grid(("removed", [0.4])), reroute_windows=8
  )
  results, _ = run(config, tmp_path / "out")
  runs = by_key(results)
  spec, fresh = runner.prepare(config)
  alone = fresh.score({"removed": 0.4}, 1, {name: spec.arm(name) for name in spec.arm_names})
  for name in spec.arm_names:
    got = {k: v for k, v in alone[name].items() if k != "pairing"}
    assert got == runs[(name, 0.4, 1)]["metrics"], name
  svd = [runs[("svd", 0.4, d)]["metrics"] for d in (0, 1)]
  td = [runs[("td_moe", 0.4, d)]["metrics"] for d in (0, 1)]
  assert svd[0] == svd[1] and td[0]["bpb"] != td[1]["bpb"]
  dense = runs[("fp32", 0.4, 0)]["metrics"]["expert_parameters"]
  assert svd[0]["expert_parameters"] <= 0.6 * dense and td[0]["expert_parameters"] <= 0.6 * dense
  assert "packed_expert_bytes" not in svd[0] and td[0]["stored_bytes"] > 0  # no type


@pytest.mark.integration
def test_the_finetuned_control_is_each_finetuned_arms_matched_reference(tiny_workdir, tmp_path):
  """At 8 bits, where quantization changes almost nothing, the fine-tuned arm routes
  like the control (the fp32 model's routers fine-tuned by the same recipe) and
  unlike the fp32 model; an arm that was not fine-tuned keeps the fp32 model as its
  reference; bpb_vs_matched is the bpb difference to that reference."""
  _, workdir = tiny_workdir
  arms = [
    {"name": "fp32", "method": "none"},
    {"name": "fp32_ft", "method": "none", "finetune": True},
    {"name": "gemq", "method": "gemq"},
    {"name": "gemq_ft", "method": "gemq", "finetune": True},
  ]
  config = configure(
    gemq_study.get_config(),
    workdir,
    arms,
    grid(("bits", [8.0])),
    draws=1,
    group_size=GROUP,
    finetune_steps=3,
    finetune_lr=3e-3,
    reroute_windows=8,
  )
  results, _ = run(config, tmp_path / "out")
  runs = {r["arm"]: r["metrics"] for r in results["runs"]}
  moved = runs["fp32_ft"]["rerouted"]  # the control against the fp32 model
  assert moved > 0.02, moved  # three router steps at 3e-3 re-route some tokens
  assert runs["gemq"]["rerouted_matched"] == runs["gemq"]["rerouted"]
  assert runs["gemq_ft"]["rerouted"] > 0.5 * moved
  assert runs["gemq_ft"]["rerouted_matched"] < 0.25 * moved
  assert runs["fp32"]["rerouted"] == 0.0 == runs["fp32_ft"]["rerouted_matched"]
  for arm, reference in (("gemq", "fp32"), ("gemq_ft", "fp32_ft")):
    assert runs[arm]["bpb_vs_matched"] == runs[arm]["bpb"] - runs[reference]["bpb"]
  assert runs["gemq"]["average_bits"] == 8.0


def test_gemq_progressive_is_compared_at_equal_total_router_finetuning_steps(tiny_workdir):
  """The progressive arm (3 rounds of finetune_steps each) is claimed against a
  one-round arm fine-tuned 3 x finetune_steps; the fine-tuning claim is the gain net
  of the fp32 control; re-routing rows have no expected direction; router
  fine-tuning runs on the LM loss alone unless the study says otherwise."""
  _, workdir = tiny_workdir
  config = gemq_study.get_config()
  config.settings.workdir, config.settings.group_size = workdir, GROUP
  spec, scorer = runner.prepare(config)
  progressive = next(c for c in spec.claims if c.arm == "gemq_progressive")
  one, many = spec.arm(progressive.reference), spec.arm("gemq_progressive")
  assert one["rounds"] == 1 and many["rounds"] == 3
  assert scorer.finetune_steps(one) == many["rounds"] * scorer.finetune_steps(many) == 96
  assert progressive.expect == "lower" and progressive.source == "paper"
  net = [c for c in spec.claims if c.arm == "gemq_ft" and c.source == "paper"]
  assert [c.metric for c in net] == ["bpb_vs_matched"]
  assert all(c.expect is None for c in spec.claims if c.metric.startswith("rerouted"))
  assert scorer.settings["finetune_aux_losses"] is False


def test_equal_bytes_pairs_cross_levels_paired_by_draw(tiny_workdir):
  """codequant at 4 bits against rtn at 3: bpb differences 0.01, 0.03 by draw give
  mean 0.02, std 0.01414, t(0.975, 1) interval [-0.1071, +0.1471]."""
  _, workdir = tiny_workdir
  spec, scorer = runner.prepare(
    configure(
      codequant_study.get_config(),
      workdir,
      codequant_study.get_config().arms,
      grid(("bits", [2.5, 3.0, 4.0])),
      group_size=GROUP,
    )
  )

  def run_(arm, bits, draw, bpb):
    return {
      "arm": arm,
      "level": {"bits": bits},
      "draw": draw,
      "metrics": {"bpb": bpb, "packed_expert_bytes": 100},
    }

  runs = [
    run_("codequant", 4.0, 0, 2.01),
    run_("codequant", 4.0, 1, 2.03),
    run_("rtn", 3.0, 0, 2.0),
    run_("rtn", 3.0, 1, 2.0),
  ]
  table = scorer._equal_bytes({"runs": runs})
  assert (
    "| codequant at 4.0 | 100 | rtn at 3.0 | 100 | +0.0200 ± 0.0141 [-0.1071, +0.1471] |" in table
  )
  assert "kmeans at 4.0" not in table  # pairs without runs are left out


@pytest.mark.integration
def test_the_w4a4_arms_run_end_to_end_on_their_compressed_models(tiny_workdir, tmp_path):
  """The study's W4A4 arms on the tiny LM: rtn_a4's bpb is the harness on the
  compressed model whose experts quantize their inputs to 4 bits (not the float
  model of its weights: that is the weight-only rtn arm's); CodeQuant as the paper
  runs it (learned rotations, a book per output column, re-clustering) is stored
  by 'codebook_rotated' at 4 average bits; the paper's claims are at 4 bits."""
  from moejax.models.structure import expert_counts
  from moejax.evaluation import harness
  from moejax.evaluation.model import DecoderLM
  from moejax.posttrain import compress_pipeline as cp
  from moejax.posttrain import compress_workdir as cw

  config, workdir = tiny_workdir
  study = codequant_study.get_config()
  arms = [a for a in study.arms if a["name"] in ("fp32", "rtn", "rtn_a4", "codequant_a4")]
  results, scorer = run(
    configure(
      study, workdir, arms, grid(("bits", [4.0])), draws=1, group_size=GROUP, equal_bytes=[]
    ),
    tmp_path / "out",
  )
  runs = {r["arm"]: r["metrics"] for r in results["runs"]}
  assert runs["rtn_a4"]["bpb"] != runs["rtn"]["bpb"]
  bench = scorer.bench
  out = cw.run(
    cp.Request("uniform", 4.0, quantizer="rtn", group_size=GROUP, act_bits=4),
    bench.source,
    bench.calibration(0),
  )
  m, params, rest = out.compressed()
  assert m.moe.experts == "quantized" and m.moe.quantized.act_bits == 4
  settings = harness.Settings(context=config.data.seq_len, probes=(), probe_count=16)
  want = harness.evaluate(
    DecoderLM(m, params, rest),
    bench.source.tokenizer,
    bench.source.tokenizer.eos_id,
    bench.documents,
    harness.Settings(context=settings.context, probes=bench.probes, probe_count=bench.probe_count),
    expert_counts(m),
  ).report["bpb"]["all"]
  assert runs["rtn_a4"]["bpb"] == want
  codequant = runs["codequant_a4"]
  assert codequant["average_bits"] == 4.0 and np.isfinite(codequant["bpb"])
  assert codequant["packed_expert_bytes"] > 0
  assert codequant["bpb"] > runs["fp32"]["bpb"] - 0.5  # a working model, not noise
  paper = [c for c in results["claims"] if c["source"] == "paper"]
  assert {(c["arm"], c["reference"]) for c in paper} == {("codequant_a4", "rtn_a4")}


@pytest.mark.parametrize(
  "study, change, message",
  [
    (
      pruning_study,
      {
        "levels": grid(("keep", ["0.5", "9"])),
        "arms": [{"name": "u", "method": "none"}, {"name": "s", "method": "greedy"}],
      },
      "study.levels[1].keep=9 is larger than the layer's 8 experts",
    ),
    (
      pruning_study,
      {"arms": [{"name": "x", "method": "obs"}]},
      "study.arms[0].method='obs' is not known",
    ),
    (
      pruning_study,
      {"arms": [{"name": "x", "method": "heapr"}], "levels": grid(("keep", ["4"]))},
      "study.levels[0].keep=4: an atom method keeps a fraction",
    ),
    (
      pruning_study,
      {"settings.num_windows": 1},
      "study.settings.num_windows=1 x data.seq_len=32 routes 64",
    ),
    (pruning_study, {"settings.probes": "facts,nope"}, "study.settings.probes='facts,nope'"),
    (pruning_study, {"levels": grid(("keep", [0.5]))}, "study.levels[0].keep=0.5 must be a str"),
    (
      pruning_study,
      {"arms": [{"name": "s", "method": "step", "merge": "sum"}]},
      "study.arms[0].merge='sum'",
    ),
    (
      pruning_study,
      {"arms": [{"name": "s", "method": "step", "rescale": True}]},
      "study.arms[0].rescale: the least-squares weights are those of the unmerged",
    ),
    (
      pruning_study,
      {"arms": [{"name": "h", "method": "heapr", "normalisation": "max"}]},
      "study.arms[0].normalisation='max'",
    ),
    (
      gemq_study,
      {"levels": grid(("bits", [1.5]))},
      "study.levels[0].bits=1.5 bits is below the minimum",
    ),
    (gemq_study, {"settings.group_size": 12}, "study.settings.group_size=12 must divide"),
    (gemq_study, {"settings.finetune_steps": 0}, "study.settings.finetune_steps=0"),
    (
      gemq_study,
      {"arms": [{"name": "t", "method": "td_moe"}]},
      "study.arms[0].method='td_moe' needs levels of removed, not bits",
    ),
    (
      gemq_study,
      {"arms": [{"name": "u", "method": "uniform", "at": "odd"}]},
      "study.arms[0].at='odd'",
    ),
    (
      gemq_study,
      {"arms": [{"name": "g", "method": "gemq", "bit_step": 0}]},
      "study.arms[0].bit_step=0 (arm 'g') must be > 0",
    ),
    (
      gemq_study,
      {"arms": [{"name": "g", "method": "gemq", "finetune_multiple": 1.5}]},
      "study.arms[0].finetune_multiple=1.5 (arm 'g') must be an integer >= 1",
    ),
    (
      codequant_study,
      {"settings.equal_bytes": [["codequant", 5.0, "rtn", 3.0]]},
      "study.settings.equal_bytes[0]",
    ),
    (
      codequant_study,
      {"arms": [{"name": "r", "method": "uniform", "at": "integer", "act_bits": 5}]},
      "study.arms[0].act_bits=5 is not supported",
    ),
    (
      codequant_study,
      {"arms": [{"name": "r", "method": "uniform", "at": "integer", "rotation": "learned"}]},
      "study.arms[0].rotation='learned' is a codebook option",
    ),
    (
      codequant_study,
      {"arms": [{"name": "k", "method": "kmeans", "recluster": True}]},
      "study.arms[0].recluster=True re-clusters after centroid fine-tuning",
    ),
    (
      codequant_study,
      {"arms": [{"name": "f", "method": "none", "act_bits": 4}]},
      "study.arms[0] (arm 'f', method none) is the float model",
    ),
    (
      td_moe_study,
      {"levels": grid(("removed", [1.2]))},
      "study.levels[0].removed=1.2: a factorisation removes a fraction",
    ),
  ],
)
def test_bad_settings_are_refused_naming_the_key(tiny_workdir, tmp_path, study, change, message):
  _, workdir = tiny_workdir
  config = study.get_config()
  config.settings.workdir = workdir
  if "group_size" in config.settings:
    config.settings.group_size = GROUP
  for key, value in change.items():
    if key.startswith("settings."):
      config.settings[key.split(".", 1)[1]] = value
    else:
      config[key] = value
  config.reference = config.arms[0]["name"]
  config.claims = []
  with pytest.raises(ConfigError) as e:
    runner.prepare(config)
  assert message in str(e.value), str(e.value)


def test_a_missing_workdir_is_refused_naming_the_setting(tmp_path):
  config = pruning_study.get_config()
  config.settings.workdir = str(tmp_path / "nothing")
  with pytest.raises(ConfigError, match=r"workdir does not exist \(study.settings.workdir="):
    runner.prepare(config)
