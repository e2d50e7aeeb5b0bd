"""Bad checkpoints fail with a ConfigError that says what is wrong and where."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from moejax.config import base_config
from moejax.errors import ConfigError
from moejax.interop.convert import export_hf, import_hf
from moejax.models.decoder import abstract_model

QPROJ = "model.layers.1.self_attn.q_proj.weight"


@pytest.fixture
def checkpoint(hf_checkpoints, tmp_path):
  """A writable copy of the tiny Mixtral checkpoint."""
  _, hf_dir = hf_checkpoints("mixtral")
  return shutil.copytree(hf_dir, tmp_path / "ckpt")


def edit_config(directory, **changes):
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    config = json.load(f)
  config.update(changes)
  with open(path, "w") as f:
    json.dump(config, f)


def rewrite_tensor(directory, name, array):
  """Replace one tensor in the shard that holds it."""
  with open(os.path.join(directory, "model.safetensors.index.json")) as f:
    file = json.load(f)["weight_map"][name]
  tensors = load_file(os.path.join(directory, file))
  tensors[name] = array
  save_file(tensors, os.path.join(directory, file), metadata={"format": "pt"})


def test_unsupported_architecture_lists_the_supported_ones(checkpoint):
  edit_config(checkpoint, model_type="llama", architectures=["LlamaForCausalLM"])
  with pytest.raises(ConfigError, match="unsupported architecture 'LlamaForCausalLM'") as e:
    import_hf(checkpoint)
  for name in (
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "OlmoeForCausalLM",
    "DeepseekV3ForCausalLM",
  ):
    assert name in str(e.value)


def test_missing_tensor_is_named(checkpoint):
  index = os.path.join(checkpoint, "model.safetensors.index.json")
  with open(index) as f:
    data = json.load(f)
  del data["weight_map"]["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
  with open(index, "w") as f:
    json.dump(data, f)
  with pytest.raises(
    ConfigError,
    match=r"'model\.layers\.1\.block_sparse_moe\.experts\.2\.w3"
    r"\.weight' is missing",
  ):
    import_hf(checkpoint)


def test_shape_mismatch_names_tensor_and_both_shapes(checkpoint):
  rewrite_tensor(checkpoint, QPROJ, np.zeros((32, 30), np.float32))
  with pytest.raises(
    ConfigError,
    match=rf"'{QPROJ}' has shape \(32, 30\); the config "
    r"expects \(32, 32\)",
  ):
    import_hf(checkpoint)


@pytest.mark.parametrize("array", [np.zeros((32, 32), np.int8), np.zeros((32, 32), bool)])
def test_dtype_moejax_cannot_hold(checkpoint, array):
  rewrite_tensor(checkpoint, QPROJ, array)
  with pytest.raises(
    ConfigError,
    match=rf"'{QPROJ}' is stored as (I8|BOOL); moejax "
    "parameters hold F64, F32, F16, BF16",
  ):
    import_hf(checkpoint)


def test_missing_config_and_unsupported_rope(checkpoint, tmp_path):
  with pytest.raises(ConfigError, match="no config.json"):
    import_hf(str(tmp_path))
  edit_config(checkpoint, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4})
  with pytest.raises(ConfigError, match="rope type 'longrope' is not supported"):
    import_hf(checkpoint)


def test_export_refuses_what_the_family_cannot_express(tmp_path):
  """A moejax LM with a shared expert is not a Mixtral: the differing keys are named."""
  c = base_config().model
  c.d_model, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim = 16, 1, 2, 1, 8
  c.moe.shared.count = 1
  m = c
  _, params, rest = abstract_model(m)
  params, rest = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (params, rest))
  with pytest.raises(ConfigError, match=r"MixtralForCausalLM cannot express.*moe\.shared\.count"):
    export_hf(m, params, rest, str(tmp_path), family="mixtral")
