"""Fixtures for the 8-device sessions. Only fixtures: this file is also loaded
by the main (1-device) session, which must not see any side effect."""

import pytest


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))
