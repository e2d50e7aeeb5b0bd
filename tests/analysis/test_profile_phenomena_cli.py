"""The phenomena on a fresh tiny MoE workdir trained on two domains: the profile CLI's
windows of the held-out documents, by hand, and its refusals; the held-out blocks; the
super-experts ablation study, draw by draw, against super_expert_ablation.ablation_study and the
harness's bpb by hand."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.analysis import super_expert_ablation as ablation
from moejax.analysis import super_experts as se
from moejax.analysis.phenomena import document_block
from moejax.errors import ConfigError
from moejax.evaluation.harness import sample_documents
from moejax.studies import runner
from moejax.train.restore import load_from_workdir
from moejax.train.sweep import load_config_file
from tests.cli.harness import assert_refused, run_entry
from tests.evaluation.domain_texts import SPLITS, tiny_domains_workdir

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

PROFILE = "experiments.profile_phenomena"


@pytest.fixture(scope="module")
def area(tmp_path_factory):
  root = tmp_path_factory.mktemp("profile")
  tiny_domains_workdir(root, root / "w")
  return root


@pytest.mark.integration
def test_profile_of_the_held_out_windows(area):
  out = area / "profile.json"
  result = run_entry(PROFILE, f"--workdir={area}/w", "--context=16", f"--out={out}")
  assert result.code == 0, result.stderr[-2000:]
  report = json.loads(out.read_text())
  # each domain one stream of [separator 0] + bytes per document, cut into whole windows
  streams = {}
  for domain, text in SPLITS["validation"]:
    streams.setdefault(domain, []).extend([0, *text.encode()])
  assert (
    report["windows_per_domain"]
    == {d: len(s) // 16 for d, s in streams.items()}
    == {"drama": 2, "code": 1}
  )
  windows = np.array(
    [s[i * 16 : (i + 1) * 16] for s in streams.values() for i in range(len(s) // 16)], np.int32
  )
  config, graphdef, params, rest, _ = load_from_workdir(f"{area}/w")
  tokens = jnp.asarray(windows)
  np.testing.assert_allclose(
    report["expert_output_peaks"], se.expert_output_peaks(graphdef, params, rest, tokens), rtol=1e-5
  )
  np.testing.assert_allclose(
    report["attention_sinks"]["mass_on_position_0"],
    se.attention_sink_mass(graphdef, params, rest, tokens),
    rtol=1e-5,
  )
  assert report["attention_sinks"]["uniform_baseline"] == pytest.approx(
    np.mean([1 / (q + 1) for q in range(1, 16)])
  )
  assert report["tokens"] == [3, 16] and report["moe_blocks"] == [0, 1]
  # the official rule (the default) keeps round(0.75 * 2) = 2 blocks: the largest a passes
  # both thresholds; the massive-layers guess finds no massive layer in an untrained model
  peaks = np.asarray(report["expert_output_peaks"])
  top = tuple(int(i) for i in np.unravel_index(np.argmax(peaks), peaks.shape))
  assert [(p["moe_layer"], p["expert"]) for p in report["super_experts"]] == [top]
  assert report["super_experts_by_rule"]["official"] == report["super_experts"]
  assert report["super_experts_by_rule"]["massive_layers"] == []
  assert len(report["super_experts_unfiltered"]) == 1  # the largest a passes both thresholds
  assert "super experts: none" not in result.stdout and "block | MoE" in result.stdout


@pytest.mark.parametrize(
  "args,names",
  [
    ([], ["--workdir"]),
    (["--workdir={a}/missing"], ["does not exist", "--workdir={a}/missing"]),
    (["--workdir={a}/w", "--quantile=101"], ["--quantile=101"]),
    (["--workdir={a}/w", "--bytes_per_domain=-1"], ["--bytes_per_domain=-1"]),
    (["--workdir={a}/w", "--out={a}"], ["directory", "--out={a}"]),
    (["--workdir={a}/w", "--context=5000"], ["--context=5000", "max_seq_len=1024"]),
    (["--workdir={a}/w", "--context=40"], ["whole window of 40", "--context=40"]),
    (["--workdir={a}/w", "--ablate"], ["flag 'ablate'"]),  # the ablation is a study now
  ],
)
def test_refused_and_nothing_written(area, args, names):
  out = area / "refused.json"
  args = [a.format(a=area) for a in args]
  if not any(a.startswith("--out") for a in args):
    args.append(f"--out={out}")
  result = run_entry(PROFILE, *args)
  assert_refused(result, *(n.format(a=area) for n in names))
  assert not out.exists()


def test_blocks_tile_each_domain_and_block_0_is_the_harness_sample():
  docs = [("a", "héllo wörld"), ("b", "xyz"), ("a", "again"), ("b", "0123456789")]
  assert document_block(docs, 0, 6) == sample_documents(docs, 6)
  assert document_block(docs, 0, 0) == docs and document_block(docs, 0, 100) == docs
  for n in (1, 3, 4, 7):
    for domain in "ab":
      whole = "".join(t for d, t in docs if d == domain).encode()
      pieces = [[t for d, t in document_block(docs, b, n) if d == domain] for b in range(30)]
      ascii_only = all(c < 128 for c in whole)
      if ascii_only:  # a multi-byte character cut at a boundary is dropped, else exact
        assert b"".join(t.encode() for p in pieces for t in p) == whole
      assert all(len("".join(p).encode()) <= n for p in pieces)
  assert document_block(docs, 1, 4) == [("a", "lo w"), ("b", "1234")]  # h é l | l o _ w
  # bytes 6..8 and 9..11 of "héllo wörld": ö (bytes 8-9) is cut, so dropped from both
  assert document_block(docs, 2, 3) == [("a", " w"), ("b", "345")]
  assert document_block(docs, 3, 3) == [("a", "rl"), ("b", "678")]
  with pytest.raises(ConfigError, match="bytes_per_domain=0"):
    document_block(docs, 1, 0)


def phenomena(area, draws=2, **settings):
  c = load_config_file("configs/studies/phenomena.py")
  c.settings = {
    "workdir": f"{area}/w",
    "bytes_per_domain": 16,
    "context": 8,
    "probes": "arithmetic",
    "probe_count": 2,
    **settings,
  }
  c.draws = draws
  return c


@pytest.mark.integration
def test_ablation_study_scores_each_block_as_ablation_study_does(area):
  """Draw d: the super-experts ablation of the d-th block of 16 held-out bytes per domain
  (random seed d); every arm equals super_expert_ablation.ablation_study on the same windows, its
  bpb the harness's on the block's documents with the arm's experts ablated, and its
  arithmetic accuracy the probe's by hand (seed d)."""
  from moejax.evaluation import probes
  from moejax.evaluation.probe_data import arithmetic_examples
  from moejax.evaluation import bpb
  from moejax.evaluation.bpb import domain_windows
  from moejax.evaluation.model import DecoderLM

  spec, scorer = runner.prepare(phenomena(area, n=2))
  out = str(area / "study")
  results = runner.run(spec, scorer, out, plot=False, log=lambda _: None)
  config, _, params, rest, tokenizer = load_from_workdir(f"{area}/w", for_generation=True)
  documents = sample_documents(SPLITS["validation"], 0)
  runs = {(r["arm"], r["draw"]): r["metrics"] for r in results["runs"]}
  for draw in (0, 1):
    block = document_block(documents, draw, 16)
    windows, _ = domain_windows(block, tokenizer, 0, 8)
    assert len(windows) == (4, 2)[draw]  # drama + code, then drama alone
    docs = bpb.encode_documents(block, tokenizer)

    def score(m, p, r):
      return {
        "bpb": bpb.bpb_by_domain(
          docs, bpb.score_documents(DecoderLM(m, p, r), docs, 0, context=8).nats
        )
      }

    old = ablation.ablation_study((config, params, rest), windows, n=2, seeds=(draw,), score=score)
    assert [a["arm"] for a in old["arms"]] == [
      "none",
      "super_experts",
      "most_frequent",
      f"random_seed{draw}",
    ]
    found = len(old["profile"]["super_experts"])
    assert found == len(old["profile"]["super_experts_by_rule"]["official"]) >= 1
    for arm, reference in zip(("none", "super_experts", "most_frequent", "random"), old["arms"]):
      new = runs[(arm, draw)]
      assert new["bpb"] == pytest.approx(reference["bpb"]["all"], rel=1e-6)
      assert new["loss_nats"] == pytest.approx(reference["loss_nats"], rel=1e-6)
      assert new["mean_mass_on_position_0"] == pytest.approx(
        reference["mean_mass_on_position_0"], rel=1e-6
      )
      assert new["max_residual"] == pytest.approx(reference["max_residual"], rel=1e-6)
      assert new["super_experts_found"] == found
      pairs = [(e["moe_layer"], e["expert"]) for e in reference["experts"]]
      lm = DecoderLM(config.model, ablation.ablate_experts(config.model, params, pairs), rest)
      correct = probes.probe_correct(
        lm, tokenizer, 0, arithmetic_examples(draw, 2), "greedy", context=8, batch_size=16
      )
      assert new["probe/arithmetic"] == pytest.approx(np.mean(correct))
  assert runs[("none", 0)]["bpb"] != runs[("none", 1)]["bpb"]  # other bytes per draw
  text = open(os.path.join(out, "results.md")).read()
  assert "Per draw: the profile" in text and "| 1 | 2 x 8 | super_experts |" in text


@pytest.mark.parametrize(
  "settings,message",
  [
    (dict(workdir="/nonexistent"), r"study\.settings\.workdir='/nonexistent' is not a training"),
    (dict(n=17), r"study\.settings\.n=17 must be at most the model's 16 experts"),
    (dict(bytes_per_domain=0), r"study\.settings\.bytes_per_domain=0 must be an integer >= 1"),
    (dict(context=5000), r"study\.settings\.context=5000 must be at most model\.max_seq_len"),
    (dict(context=40), r"no whole window of 40 tokens.*draw 0"),
    (dict(quantile=101.0), r"study\.settings\.quantile=101\.0"),
    (dict(rule="x"), r"study\.settings\.rule='x' must be one of official, massive_layers"),
    (dict(include_layers=0.0), r"study\.settings\.include_layers=0\.0 must be in \(0, 1\]"),
    (dict(probes="sums"), r"study\.settings\.probes='sums': 'sums' is not a probe"),
  ],
)
def test_ablation_study_refuses_bad_settings_before_any_run(area, settings, message):
  with pytest.raises(ConfigError, match=message):
    runner.prepare(phenomena(area, **settings))


def test_ablation_study_refuses_a_draw_past_the_held_out_bytes(area):
  with pytest.raises(ConfigError, match=r"block 2 of 16 bytes per domain has no whole window"):
    runner.prepare(phenomena(area, draws=3))
  bad = phenomena(area)
  bad.arms = [{"name": "none", "ablate": "everything"}]
  bad.claims, bad.reference = [], "none"
  with pytest.raises(ConfigError, match=r"study\.arms\[0\]\.ablate='everything'"):
    runner.prepare(bad)
