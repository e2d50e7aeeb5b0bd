"""The checks in multidevice/on8_*.py, each module in its own pytest session on
8 simulated CPU devices (this session keeps its single device)."""
import os

import pytest

from tests.sharding import subprocesses

MODULES = ("on8_expert_parallel.py", "on8_model.py", "on8_training.py")
HF_DIR_VARIABLE = "MOEJAX_TEST_DEEPSEEK_V3_HF_DIR"  # read by on8_training.py


@pytest.mark.parametrize("module", MODULES)
def test_on_8_simulated_devices(module, tmp_path):
  path = os.path.join("tests", "sharding", "multidevice", module)
  env = {}
  if module == "on8_training.py":
    # The tiny DeepSeek-V3 checkpoint is written here, where the HF tests of this
    # worker import transformers anyway, not in the child (~10 s of imports).
    from tests.interop.hf_tiny import make_model, save_model
    env[HF_DIR_VARIABLE] = save_model(make_model("deepseek_v3", vocab_size=256),
                                      str(tmp_path / "deepseek_v3"))
  result = subprocesses.run(["-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-o", "python_files=on8_*.py", path], 8, timeout=900, env=env)
  assert result.returncode == 0, result.stdout[-6000:]
