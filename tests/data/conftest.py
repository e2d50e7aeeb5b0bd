"""Shared, session-scoped data on disk: Shakespeare (both configs) and the
tiny stand-in for a user's TFDS dataset, each prepared once per test run."""

import pytest

from moejax.data import shakespeare

from .tiny_texts import write_tiny_texts


@pytest.fixture(scope='session')
def shakespeare_dir(tmp_path_factory) -> str:
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  for config in ('modern', 'modern_and_folio'):
    shakespeare.prepare_shakespeare(data_dir, config)
  return data_dir


@pytest.fixture(scope='session')
def tiny_dir(tmp_path_factory) -> str:
  data_dir = str(tmp_path_factory.mktemp('tiny'))
  write_tiny_texts(data_dir)
  return data_dir
