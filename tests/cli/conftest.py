"""One tmp area per session holding a tiny training workdir, its converted twin,
an HF export of it, and damaged copies of each (files missing, empty, corrupt,
truncated, of the wrong dtype or shape), all made without training or torch."""

import json
import os
import shutil
import types

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from moejax.configs.lm_shakespeare_dense import get_config as dense_config
from moejax.interop.convert import export_hf, save_workdir
from moejax.models.structure import moe_layer_indices
from moejax.train.load import from_training_workdir

from tests.helpers import training_workdir


def _write(path, data: bytes) -> None:
  with open(path, "wb") as f:
    f.write(data)


def _truncate(path) -> None:
  with open(path, "rb") as f:
    data = f.read()
  _write(path, data[: len(data) // 2])


def _shards(directory, suffix=".safetensors"):
  return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(suffix))


def _retype_first_tensor(directory, dtype=np.int8, shape=None) -> None:
  path = _shards(directory)[0]
  tensors = load_file(path)
  name = sorted(tensors)[0]
  tensors[name] = np.zeros(shape or tensors[name].shape, dtype)
  save_file(tensors, path, metadata={"format": "pt"})


def _damaged_copies(src: str, root: str, damages: dict) -> None:
  for name, damage in damages.items():
    copy = shutil.copytree(src, os.path.join(root, name))
    damage(copy)


@pytest.fixture(scope="session")
def area(tmp_path_factory):
  """Paths: root (hashed by every test), train, converted, hf, missing, bad/<...>."""
  root = str(tmp_path_factory.mktemp("cli_area"))
  p = types.SimpleNamespace(root=root, missing=os.path.join(root, "missing"))
  p.train, p.converted, p.hf = (os.path.join(root, n) for n in ("train", "converted", "hf"))
  training_workdir(p.train)
  loaded, _ = from_training_workdir(p.train)
  save_workdir(p.converted, loaded)
  export_hf(
    loaded.config, loaded.params, loaded.rest, p.hf, family="mixtral", max_shard_bytes=200_000
  )
  p.moe_layers, p.num_experts = len(moe_layer_indices(loaded.config)), loaded.config.moe.num_experts
  p.vocab_size = loaded.config.vocab_size

  bad = p.bad = os.path.join(root, "bad")
  os.makedirs(os.path.join(bad, "foreign"))
  _write(os.path.join(bad, "foreign", "notes.txt"), b"not a moejax workdir\n")
  os.makedirs(os.path.join(bad, "emptydir"))
  os.makedirs(os.path.join(bad, "train_no_steps", "checkpoints"))
  training_workdir(os.path.join(bad, "train_dense"), dense_config("size=tiny"))
  _write(os.path.join(bad, "afile.txt"), b"a file, not a directory\n")
  _write(os.path.join(bad, "empty.npy"), b"")
  _write(os.path.join(bad, "garbage.npy"), b"\x93NUMPY garbage")
  np.save(os.path.join(bad, "negative_ids.npy"), np.array([1, -3, 2], np.int32))
  np.save(os.path.join(bad, "short_ids.npy"), np.arange(10, dtype=np.int32))
  _write(
    os.path.join(bad, "empty_text.jsonl"),
    b'{"domain": "a", "text": "hello"}\n{"domain": "a", "text": ""}\n',
  )
  shape = (p.moe_layers, p.num_experts, p.num_experts)
  np.save(os.path.join(bad, "wrong_shape.npy"), np.zeros((2, 3), np.float32))
  np.save(os.path.join(bad, "int.npy"), np.zeros(shape, np.int32))
  np.save(
    os.path.join(bad, "good.npy"),
    np.eye(p.num_experts, dtype=np.float32)[None].repeat(p.moe_layers, 0),
  )

  def config(d):
    return os.path.join(d, "config.json")

  def index(d):
    return os.path.join(d, "model.safetensors.index.json")

  _damaged_copies(
    p.hf,
    bad,
    {
      "hf_corrupt_config": lambda d: _write(config(d), b"{not json"),
      "hf_empty_config": lambda d: _write(config(d), b""),
      "hf_list_config": lambda d: _write(config(d), b"[1, 2]"),
      "hf_no_config": lambda d: os.remove(config(d)),
      "hf_bad_values": lambda d: _write(
        config(d), json.dumps({**json.load(open(config(d))), "hidden_size": "wide"}).encode()
      ),
      "hf_truncated": lambda d: _truncate(_shards(d)[0]),
      "hf_garbage_shard": lambda d: _write(_shards(d)[0], b"garbage, not safetensors"),
      "hf_empty_shard": lambda d: _write(_shards(d)[0], b""),
      "hf_missing_shard": lambda d: os.remove(_shards(d)[0]),
      "hf_bad_index": lambda d: _write(index(d), b'{"weight_map": '),
      "hf_no_weights": lambda d: [os.remove(f) for f in _shards(d) + [index(d)]],
      "hf_wrong_dtype": _retype_first_tensor,
      "hf_wrong_shape": lambda d: _retype_first_tensor(d, np.float32, (3, 5)),
    },
  )

  def model(d):
    return os.path.join(d, "model")

  _damaged_copies(
    p.converted,
    bad,
    {
      "conv_corrupt_config": lambda d: _write(config(model(d)), b"\x00\x01garbage"),
      "conv_no_model_key": lambda d: _write(config(model(d)), b"{}"),
      "conv_truncated": lambda d: _truncate(_shards(model(d))[0]),
      "conv_wrong_dtype": lambda d: _retype_first_tensor(model(d)),
    },
  )
  _damaged_copies(
    p.train,
    bad,
    {
      "train_corrupt": lambda d: [
        _write(os.path.join(dirpath, f), b"\x00garbage")
        for dirpath, _, files in os.walk(os.path.join(d, "checkpoints"))
        for f in files
        if f.endswith(("_METADATA", "meta")) or dirpath.endswith("meta")
      ],
    },
  )
  return p
