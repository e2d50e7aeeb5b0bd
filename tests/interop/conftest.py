"""Tiny HF checkpoints of every family, made once per test session."""

import pytest

from tests.interop.hf_tiny import FAMILY_NAMES, make_model, save_model


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
  """family -> (torch model, checkpoint directory), made lazily."""
  made = {}

  def get(family):
    if family not in made:
      model = make_model(family)
      made[family] = model, save_model(model, str(tmp_path_factory.mktemp(family)))
    return made[family]

  return get


@pytest.fixture(params=FAMILY_NAMES)
def family(request):
  return request.param
