"""experiments.study: a tiny real study end to end, its resume, and every refused input
as one line with nothing written (tests/cli/harness.py)."""

import json
import os

import pytest

from tests.cli.harness import assert_refused, run_entry, tree_hash

STUDY = "experiments.study"
COVERAGE = "--config=configs/studies/interval_coverage.py"
TINY = ["--config.draws=3", "--config.settings.resamples=20", "--noplot"]


def test_a_study_runs_then_resumes_without_rerunning(tmp_path):
  out = str(tmp_path / "coverage")
  first = run_entry(STUDY, COVERAGE, *TINY, f"--out={out}")
  assert first.code == 0, first.stderr[-2000:]
  results = json.load(open(os.path.join(out, "results.json")))
  assert len(results["runs"]) == results["total_runs"] == 3 * 4 * 3  # arms x levels x draws
  assert "the t interval covers 95%" in first.stdout
  before = open(os.path.join(out, "results.json"), "rb").read()
  again = run_entry(STUDY, COVERAGE, *TINY, f"--out={out}")
  assert again.code == 0 and "resuming interval_coverage: 36 of 36 runs done" in again.stdout
  assert open(os.path.join(out, "results.json"), "rb").read() == before
  assert "draw 0" not in again.stdout  # nothing was scored again


@pytest.mark.parametrize(
  "args, names",
  [
    (
      ["--config=configs/studies/no_such_study.py"],
      ["cannot load the config file", "no_such_study.py"],
    ),
    ([COVERAGE, "--config.draws=0"], ["study.draws=0", "integer >= 1"]),
    ([COVERAGE, "--config.reference=nope"], ["study.reference='nope'", "not an arm"]),
    ([COVERAGE, "--config.scorer=nope"], ["study.scorer='nope'", "interval_coverage"]),
    ([COVERAGE, "--config.settings.sigma=-1.0"], ["study.settings.sigma=-1.0"]),
    ([COVERAGE, "--config.settings.nope=1"], ["nope", "--config.settings.nope=1"]),
  ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, names):
  out = str(tmp_path / "out")
  result = run_entry(STUDY, *args, f"--out={out}")
  assert_refused(result, *names)
  assert not os.path.exists(out)


def test_outputs_of_another_study_or_other_settings_are_refused(tmp_path):
  other = tmp_path / "other"
  other.mkdir()
  (other / "results.json").write_text(json.dumps({"study": {"name": "kmeans"}}))
  before = tree_hash(str(tmp_path))
  assert_refused(
    run_entry(STUDY, COVERAGE, *TINY, f"--out={other}"),
    "holds the results of study 'kmeans'",
    f"--out={other}",
  )
  assert tree_hash(str(tmp_path)) == before
  out = str(tmp_path / "coverage")
  assert run_entry(STUDY, COVERAGE, *TINY, f"--out={out}").code == 0
  before = tree_hash(str(tmp_path))
  assert_refused(
    run_entry(STUDY, COVERAGE, *TINY, "--config.settings.seed=1", f"--out={out}"),
    "study.settings.seed is 1 here but 0 in",
  )
  assert tree_hash(str(tmp_path)) == before


def test_a_damaged_results_file_is_named_with_what_to_do(tmp_path):
  """A results.json cut off by a kill: the refusal names the file and both ways on."""
  out = str(tmp_path / "coverage")
  assert run_entry(STUDY, COVERAGE, *TINY, f"--out={out}").code == 0
  path = os.path.join(out, "results.json")
  text = open(path).read()
  open(path, "w").write(text[: len(text) // 2])
  before = tree_hash(str(tmp_path))
  line = assert_refused(
    run_entry(STUDY, COVERAGE, *TINY, f"--out={out}"),
    f"{path} is not a complete results file",
    "JSONDecodeError",
    "--out elsewhere",
    f"delete {path}",
    f"(--out={out})",
  )
  assert "Traceback" not in line
  assert tree_hash(str(tmp_path)) == before
