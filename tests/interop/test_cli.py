"""The command lines: convert HF -> workdir -> HF, generate from an HF directory,
and generate from (and export) the default Shakespeare model's workdir."""

import os
import subprocess
import sys

import numpy as np
import transformers
import pytest

from moejax.train.load import from_training_workdir
from tests.helpers import training_workdir
from tests.interop.export_checks import read_all

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(module, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run(
    [sys.executable, "-m", module, *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


@pytest.mark.integration
def test_convert_both_ways_and_generate(hf_checkpoints, tmp_path):
  _, hf_dir = hf_checkpoints("qwen3_moe")
  workdir, out = str(tmp_path / "work"), str(tmp_path / "hf_out")
  assert "imported qwen3_moe" in cli(
    "experiments.convert", f"--hf_dir={hf_dir}", f"--workdir={workdir}"
  )
  assert "exported Qwen3MoeForCausalLM" in cli(
    "experiments.convert", f"--workdir={workdir}", f"--out_hf_dir={out}"
  )
  original, exported = read_all(hf_dir), read_all(out)
  assert sorted(original) == sorted(exported)
  assert all(np.array_equal(original[k], exported[k]) for k in original)
  printed = cli(
    "experiments.generate",
    f"--hf_dir={out}",
    "--prompt_ids=5,9,14",
    "--prompt_ids=7",
    "--max_new_tokens=4",
    "--temperature=0",
  )
  assert printed.count("--- [") == 2 and "decode routing" in printed


@pytest.mark.integration
def test_shakespeare_model_generates_and_exports_as_mixtral(tmp_path):
  workdir = str(tmp_path / "moe")
  training_workdir(workdir)  # the default Shakespeare MoE (size=tiny) at step 0
  printed = cli(
    "experiments.generate",
    f"--workdir={workdir}",
    "--prompt=ROMEO:",
    "--prompt=JULIET: O",
    "--max_new_tokens=5",
    "--top_k=5",
    "--top_p=0.9",
  )
  assert "ROMEO:" in printed and "JULIET: O" in printed and "decode routing" in printed
  out = str(tmp_path / "hf")
  printed = cli(
    "experiments.convert", f"--workdir={workdir}", f"--out_hf_dir={out}", "--check_logits"
  )
  assert "exported MixtralForCausalLM" in printed and "transformers matches" in printed
  loaded, _ = from_training_workdir(workdir)
  model = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
  assert model.config.num_local_experts == loaded.config.moe.num_experts
