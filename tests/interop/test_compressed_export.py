"""Workdirs of the compressed expert types ('quantized', 'codebook',
'factorised'; the tiny LM trained 2 steps): the HF export writes the dense
float experts and says so (printed, and in moejax_export.json), and
transformers' own forward of the exported files gives the compressed model's
logits within the float export's tolerance; a restored workdir computes
exactly what was saved (load and train resume); a checkpoint restored into a
config of another expert type is refused in one line naming both types,
before anything is read or written."""

import os
import shutil

import jax
import numpy as np
import pytest
import torch
import transformers

from moejax.errors import ConfigError
from moejax.interop.convert import Loaded, import_hf
from moejax.interop.dense_experts import EXPORT_RECORD, read_record
from moejax.train.load import from_training_workdir
from moejax.interop.parity import hf_forward, moejax_forward, padded_batch
from moejax.models.decoder import unstack_layers
from moejax.posttrain.factorise import factorised_config
from moejax.train.checkpoint import Checkpointer, expert_variable_names, jsonable
from moejax.train.loop import init_state, train_and_evaluate
from tests.cli.harness import assert_refused, run_entry, tree_hash
from tests.experts.compressed_lm import compressed_lm_config

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

ATOL = 1e-4  # the float export's tolerance (experiments.convert --check_atol)
KINDS = ("quantized", "codebook", "factorised")
RANKS = {"w_gate": (4, 16, 16), "w_up": (4, 16, 8), "w_down": (4, 8, 16)}
DETAILS = {
  "quantized": "4-bit codes, group 16",
  "codebook": "4-bit indices, group 16, hadamard rotation",
  "factorised": "Tucker ranks (expert, in, out) gate (4, 16, 16), up (4, 16, 8), down (4, 8, 16)",
}
# A variable each type's checkpoint holds (named in the mismatch error).
A_VARIABLE = {
  "swiglu": "w_down",
  "quantized": "w_down_codes",
  "codebook": "w_down_centroids",
  "factorised": "w_down/core",
}


def compressed_config(data_dir, kind):
  """The tiny LM with `kind` experts, 2 steps, checkpointed at the end."""
  if kind == "factorised":
    c = compressed_lm_config(data_dir)  # quantized settings unused once the type is factorised
    return factorised_config(c, RANKS)
  if kind == "swiglu":
    c = compressed_lm_config(data_dir)
    c.model.moe.experts = "swiglu"
    return c
  return compressed_lm_config(
    data_dir, kind, **({"rotation": "hadamard"} if kind == "codebook" else {})
  )


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
  """kind -> (config, workdir, Run) of the tiny LM trained 2 steps, made once."""
  made = {}

  def get(kind):
    if kind not in made:
      config = compressed_config(data_dir, kind)
      workdir = str(tmp_path_factory.mktemp(kind))
      made[kind] = config, workdir, train_and_evaluate(config, workdir, write_metrics=False)
    return made[kind]

  return get


@pytest.fixture(params=KINDS)
def kind(request):
  return request.param


@pytest.mark.integration
def test_export_is_dense_says_so_and_transformers_computes_the_compressed_logits(
  trained, kind, tmp_path
):
  _, workdir, _ = trained(kind)
  out = str(tmp_path / "hf")
  result = run_entry(
    "experiments.convert", f"--workdir={workdir}", f"--out_hf_dir={out}", "--check_logits"
  )
  assert result.code == 0, result.stderr[-3000:]
  record = read_record(out)
  assert record["stored_as"] == kind and record["exported_as"] == "swiglu"
  assert record["details"] == DETAILS[kind] and record["dtype"] == "float32"
  assert record["note"] == (
    f"experts {'reconstructed' if kind == 'factorised' else 'dequantized'}"
    f" from {kind!r} ({DETAILS[kind]}) to float32 for export: "
    "transformers has no such expert type"
  )
  printed = result.stdout.splitlines()
  assert printed[0] == f"exported MixtralForCausalLM to {out}"
  assert printed[1] == record["note"]  # the recorded note, printed once
  assert printed[2].startswith("transformers matches"), printed

  # The oracle: transformers' own forward of the exported files against the
  # compressed model as the workdir restores it (not the dense copy).
  loaded, _ = from_training_workdir(workdir)
  assert loaded.config.moe.experts == kind
  theirs = transformers.AutoModelForCausalLM.from_pretrained(
    out, attn_implementation="eager", dtype=torch.float32
  ).eval()
  tokens, mask, positions = padded_batch()
  real = mask.astype(bool)
  hf_logits, hf_experts = hf_forward(theirs, tokens, mask, positions)
  ours, our_experts = moejax_forward(loaded, tokens, mask)
  assert np.abs(ours - hf_logits)[real].max() <= ATOL
  for mine, hf_top in zip(our_experts, hf_experts):  # the same top-k sets at real tokens
    mine = np.sort(mine.reshape(-1, mine.shape[-1]), axis=-1)[real.reshape(-1)]
    assert np.array_equal(mine, np.sort(hf_top, axis=-1)[real.reshape(-1)])
  # The comparison can fail: 1% on the exported experts of layer 0 is seen.
  with torch.no_grad():
    for name, p in theirs.named_parameters():
      if name.startswith("model.layers.0.") and ".experts." in name:
        p.mul_(1.01)
  changed, _ = hf_forward(theirs, tokens, mask, positions)
  assert np.abs(ours - changed)[real].max() > 10 * ATOL
  # Imported back: a float ('swiglu') model computing the same logits.
  back = import_hf(out)
  assert back.config.moe.experts == "swiglu"
  assert np.abs(moejax_forward(back, tokens, mask)[0] - ours)[real].max() <= ATOL


@pytest.mark.integration
def test_export_record_is_not_carried_into_a_later_export(trained, tmp_path):
  """Import of a dense export and export again: float experts, no record copied."""
  _, workdir, _ = trained("quantized")
  first, work, second = (str(tmp_path / n) for n in ("first", "work", "second"))
  assert run_entry("experiments.convert", f"--workdir={workdir}", f"--out_hf_dir={first}").code == 0
  assert os.path.exists(os.path.join(first, EXPORT_RECORD))
  assert run_entry("experiments.convert", f"--hf_dir={first}", f"--workdir={work}").code == 0
  result = run_entry("experiments.convert", f"--workdir={work}", f"--out_hf_dir={second}")
  assert result.code == 0, result.stderr[-3000:]
  assert result.stdout.splitlines() == [f"exported MixtralForCausalLM to {second}"]
  assert read_record(second) is None and not os.path.exists(
    os.path.join(work, "model", EXPORT_RECORD)
  )


def host(tree):
  return jax.tree.map(np.asarray, tree)


@pytest.mark.integration
def test_a_restored_workdir_computes_exactly_what_was_saved(trained, kind, tmp_path):
  config, workdir, run = trained(kind)
  saved = Loaded(*unstack_layers(config.model, run.state.params, run.state.rest))
  loaded, _ = from_training_workdir(workdir)  # generate, evaluate, convert
  assert loaded.config.moe.experts == kind
  names = expert_variable_names({"params": loaded.params, "rest": loaded.rest})
  assert A_VARIABLE[kind] in names and "w_gate" not in names  # the compressed form itself
  tokens, mask, _ = padded_batch()
  want, want_experts = moejax_forward(saved, tokens, mask)
  got, got_experts = moejax_forward(loaded, tokens, mask)
  np.testing.assert_array_equal(got, want)
  for a, b in zip(got_experts, want_experts):
    np.testing.assert_array_equal(a, b)
  jax.tree.map(
    np.testing.assert_array_equal,
    host((loaded.params, loaded.rest)),
    host((saved.params, saved.rest)),
  )
  for a, b in zip(jax.tree.leaves(host(loaded.rest)), jax.tree.leaves(host(saved.rest))):
    assert a.dtype == b.dtype  # uint8 codes and indices stay uint8
  # Train resume (experiments.train): the same state, from step 2.
  copy = str(tmp_path / "resume")
  shutil.copytree(workdir, copy)
  resumed = train_and_evaluate(config, copy, write_metrics=False)
  assert resumed.start_step == 2
  jax.tree.map(np.testing.assert_array_equal, host(resumed.state), host(run.state))


def swiglu_workdir(data_dir, workdir):
  """A float ('swiglu') checkpoint of the tiny LM at step 0 (its init, as saved)."""
  config = compressed_config(data_dir, "swiglu")
  _, state, _ = init_state(config)
  ckpt = Checkpointer(workdir, max_to_keep=1)
  ckpt.save(0, host(state), {}, {"config": jsonable(config.to_dict())})
  ckpt.close()
  return workdir


@pytest.mark.parametrize(
  "saved,asked",
  [
    ("quantized", "swiglu"),
    ("swiglu", "quantized"),
    ("codebook", "quantized"),
    ("factorised", "codebook"),
  ],
)
def test_a_checkpoint_of_another_expert_type_is_refused_in_one_line(
  trained, data_dir, saved, asked, tmp_path
):
  if saved == "swiglu":
    workdir, step = swiglu_workdir(data_dir, str(tmp_path / "swiglu")), 0
  else:
    workdir, step = trained(saved)[1], 2
  _, target, _ = init_state(compressed_config(data_dir, asked))
  before = tree_hash(workdir)
  with pytest.raises(ConfigError) as refused:
    Checkpointer(workdir, read_only=True).restore(step, host(target))
  line = str(refused.value)
  assert "\n" not in line
  assert line.startswith(
    f"cannot read checkpoint {workdir}/checkpoints/{step}: it holds {saved!r} experts ("
  )
  assert f"; the config asks for {asked!r} experts (" in line
  assert A_VARIABLE[saved] in line and A_VARIABLE[asked] in line
  assert f"model.moe.experts={saved!r}" in line and line.endswith("nothing was changed.")
  assert tree_hash(workdir) == before


def test_train_resume_under_a_float_config_is_refused_by_the_cli(trained, data_dir):
  _, workdir, _ = trained("quantized")
  before = tree_hash(workdir)
  result = run_entry(
    "experiments.train",
    "--config=configs/lm_shakespeare_moe.py:size=tiny",
    f"--workdir={workdir}",
    f"--config.data.data_dir={data_dir}",
    "--config.model.moe.quantized.group_size=16",
    "--config.model.moe.experts=swiglu",
  )
  assert_refused(result, "model.moe.experts", "checkpoint='quantized'", "config='swiglu'")
  assert tree_hash(workdir) == before
