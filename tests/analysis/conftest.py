"""Fixtures of the analysis tests."""

import pytest

from tests.analysis import super_expert_model


@pytest.fixture(scope="module")
def sink_lm(tiny_config):
  """super_expert_model.sink_lm: the tiny LM whose rows start with a sink token."""
  return super_expert_model.sink_lm(tiny_config)
