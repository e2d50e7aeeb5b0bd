"""The real `python -m` path (absl's app.run, orbax logging to stderr), once:
each subprocess costs a JAX import; the other cases run in process."""

import os
import subprocess
import sys

import pytest

from tests.cli.harness import Result, assert_refused, tree_hash

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_m(module, *args) -> Result:
  done = subprocess.run(
    [sys.executable, "-m", module, *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  return Result(done.returncode, done.stdout, done.stderr)


@pytest.mark.integration
def test_refusals_through_app_run(area):
  before = tree_hash(area.root)
  assert_refused(
    python_m("experiments.generate", f"--workdir={area.train}", "--prompt_ids=5,99999"),
    "--prompt_ids=5,99999",
  )
  assert tree_hash(area.root) == before
