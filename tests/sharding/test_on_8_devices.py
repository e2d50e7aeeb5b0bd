"""The checks in multidevice/on8_*.py, each module in its own pytest session on
8 simulated CPU devices (this session keeps its single device)."""
import os

import pytest

from tests.sharding import subprocesses

MODULES = ("on8_expert_parallel.py", "on8_model.py", "on8_training.py")


@pytest.mark.parametrize("module", MODULES)
def test_on_8_simulated_devices(module):
  path = os.path.join("tests", "sharding", "multidevice", module)
  result = subprocesses.run(["-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-o", "python_files=on8_*.py", path], 8, timeout=900)
  assert result.returncode == 0, result.stdout[-6000:]
