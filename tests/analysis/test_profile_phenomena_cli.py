"""experiments.profile_phenomena on a fresh tiny MoE workdir trained on two domains:
the windows it cuts from the held-out documents, by hand, and its refusals."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.analysis import super_experts as se
from moejax.train.restore import load_from_workdir
from tests.cli.harness import assert_refused, run_entry
from tests.evaluation.domain_texts import SPLITS, tiny_domains_workdir

PROFILE = "experiments.profile_phenomena"


@pytest.fixture(scope="module")
def area(tmp_path_factory):
  root = tmp_path_factory.mktemp("profile")
  tiny_domains_workdir(root, root / "w")
  return root


def test_profile_of_the_held_out_windows(area):
  out = area / "profile.json"
  result = run_entry(PROFILE, f"--workdir={area}/w", "--context=16", f"--out={out}")
  assert result.code == 0, result.stderr[-2000:]
  report = json.loads(out.read_text())
  # each domain one stream of [separator 0] + bytes per document, cut into whole windows
  streams = {}
  for domain, text in SPLITS["validation"]:
    streams.setdefault(domain, []).extend([0, *text.encode()])
  assert report["windows_per_domain"] == {d: len(s) // 16 for d, s in streams.items()} == {
      "drama": 2, "code": 1}
  windows = np.array([s[i * 16:(i + 1) * 16] for s in streams.values()
                      for i in range(len(s) // 16)], np.int32)
  config, graphdef, params, rest, _ = load_from_workdir(f"{area}/w")
  tokens = jnp.asarray(windows)
  np.testing.assert_allclose(report["expert_output_peaks"],
                             se.expert_output_peaks(graphdef, params, rest, tokens), rtol=1e-5)
  np.testing.assert_allclose(report["attention_sinks"]["mass_on_position_0"],
                             se.attention_sink_mass(graphdef, params, rest, tokens), rtol=1e-5)
  assert report["attention_sinks"]["uniform_baseline"] == pytest.approx(
      np.mean([1 / (q + 1) for q in range(1, 16)]))
  assert report["tokens"] == [3, 16] and report["moe_blocks"] == [0, 1]
  assert report["super_experts"] == []  # an untrained model has no massive activations
  assert len(report["super_experts_unfiltered"]) == 1  # the largest a passes both thresholds
  assert "super experts: none" in result.stdout and "block | MoE" in result.stdout


@pytest.mark.parametrize("args,names", [
    ([], ["--workdir"]),
    (["--workdir={a}/missing"], ["does not exist", "--workdir={a}/missing"]),
    (["--workdir={a}/w", "--quantile=101"], ["--quantile=101"]),
    (["--workdir={a}/w", "--bytes_per_domain=-1"], ["--bytes_per_domain=-1"]),
    (["--workdir={a}/w", "--out={a}"], ["directory", "--out={a}"]),
    (["--workdir={a}/w", "--context=5000"], ["--context=5000", "max_seq_len=1024"]),
    (["--workdir={a}/w", "--context=40"], ["whole window of 40", "--context=40"]),
    (["--workdir={a}/w", "--ablate", "--ablate_n=17"], ["--ablate_n=17", "16 experts"]),
    (["--workdir={a}/w", "--ablate", "--seeds=1,1"], ["--seeds=1,1", "distinct"]),
    (["--workdir={a}/w", "--ablate", "--seeds="], ["--seeds=", "at least one"]),
    (["--workdir={a}/w", "--ablate", "--seeds=-1"], ["--seeds=-1"]),
    (["--workdir={a}/w", "--ablate", "--markdown={a}"], ["directory", "--markdown={a}"]),
    (["--workdir={a}/w", "--markdown={a}/refused.md"], ["--ablate", "--markdown="]),
    (["--workdir={a}/w", "--ablate_n=2"], ["--ablate", "--ablate_n=2"]),
])
def test_refused_and_nothing_written(area, args, names):
  out = area / "refused.json"
  args = [a.format(a=area) for a in args]
  if not any(a.startswith("--out") for a in args):
    args.append(f"--out={out}")
  result = run_entry(PROFILE, *args)
  assert_refused(result, *(n.format(a=area) for n in names))
  assert not out.exists() and not (area / "refused.md").exists()


def test_ablation_study_of_the_held_out_windows(area):
  """Each arm's bpb is the harness's on the same documents with that arm's experts
  ablated; the markdown has one row per arm."""
  out, table = area / "ablation.json", area / "ablation.md"
  result = run_entry(PROFILE, f"--workdir={area}/w", "--context=16", "--ablate",
                     "--ablate_n=2", "--seeds=0,5", f"--out={out}", f"--markdown={table}")
  assert result.code == 0, result.stderr[-2000:]
  report = json.loads(out.read_text())
  assert [a["arm"] for a in report["arms"]] == ["none", "top_a", "most_frequent",
                                                "random_seed0", "random_seed5"]
  assert report["profile"]["tokens"] == [3, 16] and report["n"] == 2
  from moejax.analysis.super_experts import ablate_experts
  from moejax.evaluation import bpb
  from moejax.evaluation.model import DecoderLM
  config, _, params, rest, tokenizer = load_from_workdir(f"{area}/w")
  docs = bpb.encode_documents(SPLITS["validation"], tokenizer)
  for arm in report["arms"]:
    ablated = ablate_experts(config.model, params,
                             [(e["moe_layer"], e["expert"]) for e in arm["experts"]])
    nats = bpb.score_documents(DecoderLM(config.model, ablated, rest), docs, 0, context=16).nats
    assert arm["bpb"]["all"] == pytest.approx(bpb.bpb_by_domain(docs, nats)["all"], rel=1e-5)
  assert len({a["bpb"]["all"] for a in report["arms"]}) > 1
  rows = [line for line in table.read_text().splitlines() if line.startswith("| ")]
  assert [r.split(" | ")[0][2:] for r in rows[1:]] == [a["arm"] for a in report["arms"]]
  assert "Super experts by the paper's rule: none" in result.stdout
