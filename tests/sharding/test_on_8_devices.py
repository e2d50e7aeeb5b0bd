"""The checks in multidevice/on8_*.py, in one pytest session on 8 simulated CPU
devices (this session keeps its single device). One child, not one per module:
each child pays ~15 s of imports and data preparation before its first check;
its output names any check that fails. Its checks marked `integration` (whole
training runs) follow this session's --integration-share."""

import os
import pytest

from tests.sharding import subprocesses

pytestmark = pytest.mark.multidevice  # child processes; runs first (tests/conftest.py)

HF_DIR_VARIABLE = "MOEJAX_TEST_DEEPSEEK_V3_HF_DIR"  # read by on8_training.py


def test_on_8_simulated_devices(tmp_path, request):
  # The tiny DeepSeek-V3 checkpoint is written here, where the HF tests of this
  # worker import transformers anyway, not in the child (~10 s of imports).
  from tests.interop.hf_tiny import make_model, save_model

  env = {
    HF_DIR_VARIABLE: save_model(
      make_model("deepseek_v3", vocab_size=256), str(tmp_path / "deepseek_v3")
    )
  }
  result = subprocesses.run(
    [
      "-m",
      "pytest",
      "-q",
      "-rA",
      "-p",
      "no:cacheprovider",
      "-o",
      "python_files=on8_*.py",
      # The child runs this session's share of its `integration` checks.
      f"--integration-share={request.config.getoption('integration_share')}",
      os.path.join("tests", "sharding", "multidevice"),
    ],
    8,
    timeout=1500,
    env=env,
  )
  assert result.returncode == 0, result.stdout[-8000:]
  assert " passed" in result.stdout and "no tests ran" not in result.stdout
