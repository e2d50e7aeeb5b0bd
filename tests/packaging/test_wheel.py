"""The wheel that `pip install .` builds: only the moejax namespace, and the
runtime stack declared as version ranges that hold requirements.txt's pins.

Builds from a copy of the checkout (no build/ or egg-info left in the repo, and
no stale build/lib from an earlier build leaking into the wheel), offline:
--no-build-isolation uses the venv's setuptools.
"""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Pinned in requirements.txt for the tested stack, imported by no moejax code
# (psutil: by experiments/benchmarks/large_checkpoint.py only).
TRANSITIVE_PINS = {"chex", "protobuf", "psutil"}
TOP_LEVEL_IMPORT = re.compile(r"^\s*(from|import)\s+(kernels|configs|experiments|tests)\b", re.M)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
  src, out = tmp_path_factory.mktemp("src") / "moejax", tmp_path_factory.mktemp("wheel")
  shutil.copytree(
    ROOT,
    src,
    symlinks=True,
    ignore=shutil.ignore_patterns(
      ".git", ".venv", "build", "runs", "*.egg-info", "__pycache__", ".hypothesis", "docs"
    ),
  )
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "--no-deps",
      "--no-build-isolation",
      "--no-index",
      "-q",
      "-w",
      str(out),
      str(src),
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  (path,) = out.glob("moejax-*.whl")
  with zipfile.ZipFile(path) as whl:
    yield whl


def test_only_the_moejax_namespace_is_installed(wheel):
  tops = {name.split("/")[0] for name in wheel.namelist()}
  assert not tops & {"kernels", "configs", "experiments", "tests"}, sorted(tops)
  assert {top for top in tops if not top.endswith(".dist-info")} == {"moejax"}, sorted(tops)


def test_kernels_and_configs_ship_inside_moejax(wheel):
  names = set(wheel.namelist())
  for name in (
    "moejax/kernels/__init__.py",
    "moejax/kernels/grouped_matmul.py",
    "moejax/kernels/gmm_gpu.py",
    "moejax/kernels/gmm_tpu.py",
    "moejax/configs/__init__.py",
    "moejax/configs/lm_shakespeare_moe.py",
    "moejax/configs/lm_shakespeare_dense.py",
    "moejax/dispatch/dropless.py",
  ):
    assert name in names, name


def test_installed_code_imports_no_checkout_only_top_level_package(wheel):
  """`from kernels import ...` in the wheel would import another project's `kernels`."""
  offenders = {}
  for name in wheel.namelist():
    if name.endswith(".py"):
      found = TOP_LEVEL_IMPORT.findall(wheel.read(name).decode())
      if found:
        offenders[name] = found
  assert not offenders


def test_runtime_dependencies_are_ranges_that_hold_the_tested_pins(wheel):
  (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
  declared = [
    Requirement(line.split(":", 1)[1].strip())
    for line in wheel.read(metadata).decode().splitlines()
    if line.startswith("Requires-Dist:")
  ]
  runtime = {canonicalize_name(r.name): r for r in declared if r.marker is None}
  pins = {}
  with open(os.path.join(ROOT, "requirements.txt")) as f:
    for line in f:
      line = line.split("#")[0].strip()
      if line:
        name, version = line.split("==")
        pins[canonicalize_name(name)] = version
  assert set(pins) - set(runtime) == {canonicalize_name(n) for n in TRANSITIVE_PINS}
  for name, req in runtime.items():
    ops = {spec.operator for spec in req.specifier}
    assert ops == {">=", "<"}, f"{req}: expected a range >=low,<high"
    if name in pins:
      assert req.specifier.contains(pins[name]), f"{req} excludes the tested {pins[name]}"
