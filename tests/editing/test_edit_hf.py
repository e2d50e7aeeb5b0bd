"""experiments.edit on an imported HF checkpoint (a tiny random Qwen3-MoE saved by
transformers, with a byte-level tokenizer.json): the edited model is written as a
converted workdir whose only changed tensors are the edited block's expert down
projections, and the edit lowers its objective; without a tokenizer it is refused."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from moejax.posttrain import source as source_lib
from tests.interop.hf_tiny import make_model, save_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def byte_tokenizer_json(path: str) -> None:
  """A tokenizer.json whose ids are the UTF-8 bytes (GPT-2's byte-to-character table,
  no merges), so a 256-token model reads text as moejax's byte tokenizer does."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers

  printable = [
    *range(ord("!"), ord("~") + 1),
    *range(ord("¡"), ord("¬") + 1),
    *range(ord("®"), ord("ÿ") + 1),
  ]
  others = [b for b in range(256) if b not in printable]
  char = {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}
  tokenizer = Tokenizer(models.BPE(vocab={char[b]: b for b in range(256)}, merges=[]))
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.save(path)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  root = tmp_path_factory.mktemp("edit_hf")
  directory = save_model(make_model("qwen3_moe", vocab_size=256), str(root / "hf"))
  byte_tokenizer_json(os.path.join(directory, "tokenizer.json"))
  np.save(root / "calibration.npy", np.random.RandomState(0).randint(3, 256, size=4096))
  return root


def edit(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    [sys.executable, "-m", "experiments.edit", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.mark.integration
def test_an_imported_model_is_edited_only_in_the_edited_blocks_down_projections(hf):
  out = hf / "out"
  run = edit(
    f"--hf_dir={hf / 'hf'}",
    f"--calibration={hf / 'calibration.npy'}",
    "--facts=2",
    "--layers=1",
    "--method=lstsq",
    "--num_windows=8",
    f"--out={out}",
    f"--report={hf / 'report.json'}",
  )
  assert run.returncode == 0, run.stderr[-2000:]
  report = json.load(open(hf / "report.json"))
  objective = report["layers"][0]["objective"]
  assert report["layers"][0]["block"] == 1 and objective[-1] < 0.5 * objective[0]
  before = source_lib.load(hf_dir=str(hf / "hf")).params
  after = source_lib.load(workdir=str(out)).params
  flat_before = dict(jax.tree_util.tree_flatten_with_path(before)[0])
  flat_after = dict(jax.tree_util.tree_flatten_with_path(after)[0])
  assert flat_before.keys() == flat_after.keys()
  changed = [
    jax.tree_util.keystr(k)
    for k in flat_before
    if not np.array_equal(flat_before[k], flat_after[k])
  ]
  assert changed == ["['blocks'][1]['ffn']['experts']['w_down']"], changed


def test_an_imported_model_without_a_tokenizer_is_refused(hf, tmp_path):
  bare = tmp_path / "bare"
  shutil.copytree(hf / "hf", bare)
  os.remove(bare / "tokenizer.json")
  run = edit(
    f"--hf_dir={bare}",
    f"--calibration={hf / 'calibration.npy'}",
    "--facts=2",
    "--layers=1",
    "--method=lstsq",
    f"--out={tmp_path / 'out'}",
  )
  assert run.returncode == 2 and run.stderr.strip().count("\n") == 0, run.stderr[-2000:]
  assert "no tokenizer" in run.stderr and "--hf_dir" in run.stderr
  assert not (tmp_path / "out").exists()
