"""experiments.evaluate end to end on a fresh tiny MoE workdir, and its refusals."""
import json

import jax
import numpy as np
import pytest
from flax import nnx

from moejax.interop.load import load_model
from tests.cli.conftest import training_workdir
from tests.cli.harness import assert_refused, run_entry

EVAL = "experiments.evaluate"
DOCS = [{"domain": "drama", "text": "ROMEO: But soft!"}, {"domain": "code", "text": "x = 1\n"},
        {"domain": "drama", "text": "JULIET: Ay me."}]


@pytest.fixture(scope="module")
def area(tmp_path_factory):
  root = tmp_path_factory.mktemp("evaluate")
  training_workdir(str(root / "w"))
  (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
  (root / "bad.jsonl").write_text('{"domain": "a"}\n')
  return root


def test_run_against_itself(area):
  out = area / "report.json"
  result = run_entry(EVAL, f"--workdir={area}/w", f"--docs={area}/docs.jsonl",
                     f"--reference_workdir={area}/w", "--probes=arithmetic", "--probe_count=1",
                     "--bootstrap_resamples=20", f"--out={out}")
  assert result.code == 0, result.stderr[-2000:]
  report = json.loads(out.read_text())
  assert "drama |" in result.stdout and report["documents"] == {"code": 1, "drama": 2}
  # oracle: one direct forward pass per document after the separator byte 0 (one
  # right-padded batch: the causal model's logits of a prefix ignore what follows)
  model = load_model(f"{area}/w")[0].model()
  seqs = [np.frombuffer(b"\0" + d["text"].encode(), np.uint8).astype(np.int32) for d in DOCS]
  batch = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
  for i, seq in enumerate(seqs):
    batch[i, :len(seq)] = seq
  logp = np.asarray(jax.nn.log_softmax(nnx.jit(lambda m, x: m(x)[0])(model, batch), -1))
  nats = {}
  for i, (d, seq) in enumerate(zip(DOCS, seqs)):
    picked = logp[i, np.arange(len(seq) - 1), seq[1:]].astype(np.float64)
    nats[d["domain"]] = nats.get(d["domain"], 0) - picked.sum()
  assert report["bpb"]["code"] == pytest.approx(nats["code"] / np.log(2) / 6, rel=1e-5)
  assert report["bpb"]["all"] == pytest.approx(sum(nats.values()) / np.log(2) / 36, rel=1e-5)
  assert report["probes"]["arithmetic"]["all"]["n"] == 2
  assert report["reference"]["difference"]["all"]["high"] == 0.0
  assert report["reference"]["topk_set_changed"] == [0.0, 0.0]
  assert len(report["routing"]) == 2 and set(report["routing"][0]["usage"]) == {"code", "drama"}


@pytest.mark.parametrize("args,names", [
    ([], ["--workdir", "--hf_dir"]),
    (["--workdir={a}/w", "--hf_dir={a}"], ["--workdir", "--hf_dir"]),
    (["--workdir={a}/w", "--reference_workdir={a}/w", "--reference_hf_dir={a}"],
     ["--reference_workdir", "--reference_hf_dir"]),
    (["--workdir={a}/w", "--docs={a}/docs.jsonl", "--probes=facts,trivia"],
     ["'trivia'", "--probes=facts,trivia"]),
    (["--workdir={a}/w", "--docs={a}/bad.jsonl"], ["--docs=", "bad.jsonl, line 1", "text"]),
    (["--workdir={a}/w", "--docs={a}/none.jsonl"], ["does not exist", "none.jsonl"]),
    (["--workdir={a}/w", "--context=-1"], ["--context=-1"]),
])
def test_refused(area, args, names):
  result = run_entry(EVAL, *(a.format(a=area) for a in args))
  assert_refused(result, *names)
