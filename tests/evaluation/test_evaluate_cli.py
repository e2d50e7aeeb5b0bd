"""experiments.evaluate end to end on a fresh tiny MoE workdir, and its refusals."""

import json

import numpy as np
import pytest

from moejax.train.load import load_model
from tests.helpers import training_workdir
from tests.cli.harness import assert_refused, run_entry
from tests.evaluation.oracles import direct_logprobs
from tests.evaluation.domain_texts import SPLITS, tiny_domains_workdir

EVAL = "experiments.evaluate"
DOCS = [
  {"domain": "drama", "text": "ROMEO: But soft!"},
  {"domain": "code", "text": "x = 1\n"},
  {"domain": "drama", "text": "JULIET: Ay me."},
]


@pytest.fixture(scope="module")
def area(tmp_path_factory):
  root = tmp_path_factory.mktemp("evaluate")
  training_workdir(str(root / "w"))
  (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
  (root / "bad.jsonl").write_text('{"domain": "a"}\n')
  tiny_domains_workdir(root, root / "domains")
  return root


@pytest.mark.integration
def test_run_against_itself(area):
  out = area / "report.json"
  result = run_entry(
    EVAL,
    f"--workdir={area}/w",
    f"--docs={area}/docs.jsonl",
    f"--reference_workdir={area}/w",
    "--probes=arithmetic",
    "--probe_count=1",
    "--bootstrap_resamples=20",
    f"--out={out}",
  )
  assert result.code == 0, result.stderr[-2000:]
  report = json.loads(out.read_text())
  assert "drama |" in result.stdout and report["documents"] == {"code": 1, "drama": 2}
  # oracle: one direct forward pass per document after the separator byte 0
  logprobs, _ = direct_logprobs(load_model(f"{area}/w")[0].model(), [d["text"] for d in DOCS])
  nats = {}
  for d, logp in zip(DOCS, logprobs):
    nats[d["domain"]] = nats.get(d["domain"], 0) - logp.sum()
  assert report["bpb"]["code"] == pytest.approx(nats["code"] / np.log(2) / 6, rel=1e-5)
  assert report["bpb"]["all"] == pytest.approx(sum(nats.values()) / np.log(2) / 36, rel=1e-5)
  assert report["probes"]["arithmetic"]["all"]["n"] == 2
  assert report["reference"]["difference"]["all"]["high"] == 0.0
  assert report["reference"]["topk_set_changed"] == [0.0, 0.0]
  assert len(report["routing"]) == 2 and set(report["routing"][0]["usage"]) == {"code", "drama"}


def test_held_out_split_of_the_training_data_by_default(area):
  result = run_entry(EVAL, f"--workdir={area}/domains", f"--out={area}/d.json")
  assert result.code == 0, result.stderr[-2000:]
  report = json.loads((area / "d.json").read_text())
  assert report["documents"] == {"code": 1, "drama": 2}
  # not trained on mix: by default only the passage probes (too short here for an example)
  assert {name: groups["all"]["n"] for name, groups in report["probes"].items()} == {
    "next_passage": 0,
    "last_word": 0,
  }
  assert report["bytes"] == sum(len(text) for _, text in SPLITS["validation"])
  assert report["context"] == 32  # the training seq_len


# the flag and source refusals of every entry point are in tests/cli/test_contract.py;
# these need a documents file or a loaded model
@pytest.mark.parametrize(
  "args,names",
  [
    (["--workdir={a}/w", "--docs={a}/bad.jsonl"], ["--docs=", "bad.jsonl, line 1", "text"]),
    (["--workdir={a}/w", "--docs={a}/none.jsonl"], ["does not exist", "none.jsonl"]),
    (
      ["--workdir={a}/w", "--docs={a}/docs.jsonl", "--context=5000"],
      ["--context=5000", "max_seq_len=1024"],
    ),
    (["--workdir={a}/w", "--docs={a}/docs.jsonl", "--stride=33"], ["--stride=33", "32"]),
  ],
)
def test_refused(area, args, names):
  result = run_entry(EVAL, *(a.format(a=area) for a in args))
  assert_refused(result, *names)
