"""The README's promises: its Python example runs as written, and every relative
link points at a file or directory of the repository."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()


def test_every_relative_link_exists():
  links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
  local = [link for link in links if not link.startswith(("http://", "https://"))]
  assert len(local) >= 10
  missing = [link for link in local if not os.path.exists(os.path.join(ROOT, link))]
  assert not missing, f"README links to missing paths: {missing}"


@pytest.mark.integration
def test_the_python_example_runs(tmp_path):
  blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
  assert len(blocks) == 1
  code = blocks[0].replace("/tmp/moejax_api", str(tmp_path / "run"))
  code += "\nassert y.shape == (2, 16, 32) and aux['expert_index'].shape[0] == 32\n"
  code += "assert run.eval['val_bpb'] > 0 and len(out.row(0)) == 32\n"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run(
    [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
  )
  assert result.returncode == 0, result.stderr[-3000:]
