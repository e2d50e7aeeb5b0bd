"""The tiny MoE trained on a bigram chain that the pruning scores are checked on.
The workdir-level post-training tests (pruning, compression) start from
tests/conftest.py's tiny_workdir."""

import os

import pytest


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory):
  """trained_tiny.trained(): the tiny MoE trained on a bigram chain, trained once for
  all the run's worker processes (in the directory they share) and loaded by the rest."""
  from tests.posttrain.trained_tiny import trained

  shared = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):  # one process of `pytest -n`: its run's directory
    shared = shared.parent
  return trained(str(shared))
