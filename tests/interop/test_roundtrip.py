"""Import -> export gives the checkpoint back tensor for tensor, and transformers
loads it; a model with one expert removed per layer exports, loads and runs
in transformers with moejax's logits."""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers

from moejax.models.structure import moe_layer_indices
from moejax.migrate import flatten_config
from moejax.errors import ConfigError
from moejax.interop.convert import export_hf, import_hf, load_workdir, save_workdir
from moejax.interop.safetensors_io import SafetensorsReader
from moejax.interop.parity import hf_forward, moejax_forward, padded_batch

from tests.interop.export_checks import read_all


def test_import_export_gives_identical_tensors(hf_checkpoints, family, tmp_path):
  model, hf_dir = hf_checkpoints(family)
  loaded = import_hf(hf_dir)
  out = str(tmp_path / "out")
  export_hf(
    loaded.config,
    loaded.params,
    loaded.rest,
    out,
    base_hf_config=loaded.hf_config,
    max_shard_bytes=30_000,
  )
  original, exported = read_all(hf_dir), read_all(out)
  assert sorted(original) == sorted(exported)
  for name in original:
    np.testing.assert_array_equal(exported[name], original[name], err_msg=name)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
  theirs = model.state_dict()
  for name, tensor in reloaded.state_dict().items():
    assert torch.equal(tensor, theirs[name]), name


def test_workdir_round_trip(hf_checkpoints, tmp_path):
  _, hf_dir = hf_checkpoints("qwen2_moe")
  loaded = import_hf(hf_dir)
  save_workdir(str(tmp_path), loaded, extra_files_from=hf_dir)
  back = load_workdir(str(tmp_path))
  # JSON keeps no tuples: compare the flat configs (lists and tuples alike)
  assert flatten_config(back.config.to_dict()) == flatten_config(loaded.config.to_dict())
  assert back.hf_config == loaded.hf_config
  for a, b in zip(
    jax.tree.leaves((loaded.params, loaded.rest)), jax.tree.leaves((back.params, back.rest))
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert os.path.exists(tmp_path / "model" / "generation_config.json")


def remove_one_expert_per_layer(loaded):
  """Drop expert (layer + 1) % E from every MoE layer: a stand-in for a pruner."""
  params, rest, m = loaded.params, loaded.rest, loaded.config
  for layer in moe_layer_indices(m):
    ffn, ffn_rest = params["blocks"][layer]["ffn"], rest.get("blocks", {}).get(layer, {})
    num_experts = ffn["router_kernel"].shape[-1]
    keep = np.array([e for e in range(num_experts) if e != (layer + 1) % num_experts])
    ffn["router_kernel"] = ffn["router_kernel"][:, keep]
    for name in ("w_gate", "w_up", "w_down"):
      ffn["experts"][name] = ffn["experts"][name][keep]
    if "router_state" in ffn_rest.get("ffn", {}):
      ffn_rest = ffn_rest["ffn"]
      ffn_rest["router_state"]["bias"] = ffn_rest["router_state"]["bias"][keep]
  m.moe.num_experts -= 1
  if m.moe.num_experts % m.moe.routing.num_groups:  # unequal groups: route over all experts
    m.moe.routing.num_groups = m.moe.routing.topk_groups = 1
  return loaded


def test_export_with_one_expert_removed_runs_in_transformers(hf_checkpoints, family, tmp_path):
  _, hf_dir = hf_checkpoints(family)
  pruned = remove_one_expert_per_layer(import_hf(hf_dir))
  out = str(tmp_path / "pruned")
  hf = export_hf(pruned.config, pruned.params, pruned.rest, out, base_hf_config=pruned.hf_config)
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f) == hf
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
  tokens, mask, positions = padded_batch()
  hf_logits, hf_experts = hf_forward(reloaded, tokens, mask, positions)
  pruned.config.moe.grouped_matmul = "tiled"
  logits, experts = moejax_forward(pruned, tokens, mask)
  real = mask.astype(bool)
  assert np.isfinite(hf_logits).all()
  assert np.abs(logits - hf_logits)[real].max() <= 1e-4
  assert all(e.shape[-1] == hf_e.shape[-1] for e, hf_e in zip(experts, hf_experts))


def test_export_refuses_unequal_expert_counts(hf_checkpoints, tmp_path):
  _, hf_dir = hf_checkpoints("mixtral")
  loaded = import_hf(hf_dir)
  ffn = loaded.params["blocks"][0]["ffn"]
  ffn["router_kernel"] = ffn["router_kernel"][:, :3]
  for name in ("w_gate", "w_up", "w_down"):
    ffn["experts"][name] = ffn["experts"][name][:3]
  with pytest.raises(ConfigError, match=r"one expert count.*\[3, 4\]"):
    export_hf(loaded.config, loaded.params, loaded.rest, str(tmp_path))


def test_export_in_bfloat16_halves_the_bytes(hf_checkpoints, tmp_path):
  _, hf_dir = hf_checkpoints("olmoe")
  loaded = import_hf(hf_dir)
  hf = export_hf(loaded.config, loaded.params, loaded.rest, str(tmp_path), dtype="bfloat16")
  assert hf["dtype"] == "bfloat16"
  reader = SafetensorsReader(str(tmp_path))
  name = "model.layers.1.mlp.experts.3.up_proj.weight"
  assert reader._handle(name).get_slice(name).get_dtype() == "BF16"
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
  assert reloaded.dtype == torch.bfloat16
