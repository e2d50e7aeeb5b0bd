"""Conversion that never holds the model: HF checkpoint <-> converted workdir,
one tensor (one expert of a stacked array) at a time.

  import_to_workdir(hf_dir, workdir)         the workdir save_workdir(import_hf(hf_dir)) writes
  export_workdir(workdir, out_dir, ...)      the checkpoint export_hf(*load_workdir(workdir)) writes

import_hf/export_hf (convert.py) build the whole parameter tree in memory,
which is what a tool working on the model needs; converting between the two
formats does not. Here the output's every tensor (name, shape, dtype) is known
from the config before a byte is read (abstract_model and tensor_maps), so the
output shards' headers are written first (safetensors_io.PlannedWriter) and
each tensor read (SafetensorsReader: pread, no memory map) goes straight to
its offset; an expert's HF tensor is written as its row of the stacked moejax
array, and read back as one row on export. Peak memory: the interpreter and
one HF tensor (the embedding, usually), whatever the checkpoint's size.
The files are the same tensors under the same names, shard for shard as the
in-memory path writes them (tests/interop/test_streaming_convert.py); one
difference: import_hf reads DeepSeek-V3's e_score_correction_bias (router
state, float32) through --param_dtype, so bfloat16 rounds it, where here it is
read as float32. Export of compressed experts (dense_experts.py) is refused:
it needs the model (export_hf).

  import_to_orbax(hf_dir, directory, mesh_layout({'fsdp': 2, 'expert': 4}))
  m, params, rest = load_orbax(directory, layout)

writes the {'params', 'rest'} trees as one orbax checkpoint, each array made
in its sharding on the mesh (logical axes -> mesh axes as training places
them, moejax/sharding.py) from the HF tensors its local shards cover, a few
arrays per orbax partial save; load_orbax restores it onto any mesh.
"""

import json
import os

import numpy as np
from flax import nnx

from moejax.models.structure import moe_layer_indices
from moejax.migrate import model_config_from_dict
from moejax.validation import validate_model
from moejax.errors import ConfigError
from moejax.interop.convert import (
  PARAM_DTYPES,
  WORKDIR_MODEL,
  check_shapes,
  config_for_params,
  copy_extra_files,
  read_config_json,
)
from moejax.interop.hf_config import from_hf_config, to_hf_config
from moejax.interop.names import tensor_maps
from moejax.interop.safetensors_io import PlannedWriter, SafetensorsReader, read_json
from moejax.models.decoder import abstract_model


def _key(tm) -> str:
  """The workdir's name of a TensorMap's array (save_workdir's naming)."""
  return f"{tm.collection}/{'.'.join(map(str, tm.path))}"


def _leaf(trees, tm):
  tree = trees[tm.collection]
  for key in tm.path:
    tree = tree[key]
  return tree


def _workdir_specs(trees, dtype):
  """(name, shape, dtype) of every array in save_workdir's order: params in the
  given dtype, rest (router state) in its own."""
  for collection in ("params", "rest"):
    for path, spec in nnx.traversals.flatten_mapping(trees[collection]).items():
      yield (
        f"{collection}/{'.'.join(map(str, path))}",
        tuple(spec.shape),
        dtype if collection == "params" else spec.dtype,
      )


def _config_from_hf(hf_dir: str):
  hf = read_config_json(hf_dir)
  try:
    return hf, from_hf_config(hf)
  except (ConfigError, TypeError, ValueError, KeyError, AttributeError) as e:
    raise ConfigError(f"{e} ({os.path.join(hf_dir, 'config.json')})") from e


def import_to_workdir(
  hf_dir: str,
  workdir: str,
  param_dtype: str = "float32",
  *,
  max_shard_bytes: int = 2 << 30,
  extra_files_from: str | None = None,
):
  """Write workdir/model/ from an HF directory, tensor by tensor; returns
  (model config, checkpoint tensors no parameter reads)."""
  if param_dtype not in PARAM_DTYPES:
    raise ConfigError(f"param_dtype={param_dtype!r}; valid: {', '.join(PARAM_DTYPES)}")
  dtype = np.dtype(PARAM_DTYPES[param_dtype])
  hf, m = _config_from_hf(hf_dir)
  _, params, rest = abstract_model(m)
  trees = {"params": params, "rest": rest}
  maps = tensor_maps(m)
  reader = SafetensorsReader(hf_dir)
  for tm in maps:  # every tensor present, of its shape and a readable dtype, before writing
    hf_shape = tm.hf_shape(_leaf(trees, tm).shape)
    for name in tm.hf_names:
      reader._checked_shape(name, hf_shape)  # noqa: SLF001 - the reader's own check
  directory = os.path.join(workdir, WORKDIR_MODEL)
  writer = PlannedWriter(
    directory,
    _workdir_specs(trees, dtype),
    max_shard_bytes,
    prefix="params",
    index_file="params.index.json",
  )
  used: set[str] = set()
  for tm in maps:
    target = _leaf(trees, tm)
    hf_shape = tm.hf_shape(target.shape)
    out_dtype = dtype if tm.collection == "params" else np.dtype(target.dtype)
    orient = (lambda a: a.T) if tm.transpose else (lambda a: a)
    if tm.stacked:
      for e, name in enumerate(tm.hf_names):
        writer.write_part(_key(tm), e, orient(reader.read(name, hf_shape, out_dtype)))
    else:
      writer.write(_key(tm), orient(reader.read(tm.hf_names[0], hf_shape, out_dtype)))
    used.update(tm.hf_names)
  writer.close()
  reader.close()
  m = config_for_params(m, params)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({"model": m.to_dict(), "hf_config": hf}, f, indent=2)
  if extra_files_from:
    copy_extra_files(extra_files_from, directory)
  return m, tuple(sorted(set(reader.names()) - used))


def _workdir_config(workdir: str):
  directory = os.path.join(workdir, WORKDIR_MODEL)
  path = os.path.join(directory, "config.json")
  saved = read_json(path)
  if not isinstance(saved.get("model"), dict):
    raise ConfigError(f"no 'model' object: not a converted workdir's config ({path})")
  m = model_config_from_dict(saved["model"])
  validate_model(m)
  return directory, m, saved.get("hf_config")


def export_workdir(
  workdir: str,
  out_dir: str,
  *,
  family: str | None = None,
  dtype: str | None = None,
  max_shard_bytes: int = 2 << 30,
  extra_files_from: str | None = None,
) -> dict:
  """export_hf of a converted workdir without loading it (same arguments); returns
  the config.json written."""
  directory, m, base = _workdir_config(workdir)
  if m.moe.get("experts", "swiglu") != "swiglu" and moe_layer_indices(m):
    raise ConfigError(
      f"{workdir} holds {m.moe.experts!r} experts: export them with export_hf "
      "(experiments.convert), which writes their dense weights; streaming "
      "export writes stored SwiGLU experts only"
    )
  if dtype and dtype not in PARAM_DTYPES:
    raise ConfigError(f"dtype={dtype!r}; valid: {', '.join(PARAM_DTYPES)}")
  reader = SafetensorsReader(directory, index_file="params.index.json")
  _, params, rest = abstract_model(m)
  trees = {"params": params, "rest": rest}
  for collection, tree in trees.items():  # every array present, with its shape, first
    for path, spec in nnx.traversals.flatten_mapping(tree).items():
      reader._checked_shape(
        f"{collection}/{'.'.join(map(str, path))}",  # noqa: SLF001 - own check
        spec.shape,
      )
  m = config_for_params(m, params)
  check_shapes(m, params, rest)
  hf = to_hf_config(m, family, base)
  m.family = hf["model_type"]
  cast = np.dtype(PARAM_DTYPES[dtype]) if dtype else None
  maps = tensor_maps(m)

  def out_dtype(tm):  # without a cast, the dtype load_workdir gives (the model's)
    own = np.dtype(_leaf(trees, tm).dtype)
    return cast if cast is not None and tm.collection == "params" else own

  specs = []
  for tm in maps:
    hf_shape = tm.hf_shape(_leaf(trees, tm).shape)
    specs += [(name, hf_shape, out_dtype(tm)) for name in tm.hf_names]
  writer = PlannedWriter(out_dir, specs, max_shard_bytes)
  for tm in maps:
    shape, to = tuple(_leaf(trees, tm).shape), out_dtype(tm)
    orient = (lambda a: a.T) if tm.transpose else (lambda a: a)
    if tm.stacked:
      for e, name in enumerate(tm.hf_names):
        writer.write(name, orient(reader.read_part(_key(tm), e, shape, to)))
    else:
      writer.write(tm.hf_names[0], orient(reader.read(_key(tm), shape, to)))
  writer.close()
  reader.close()
  hf["dtype"] = dtype or str(np.dtype(params["embed"].dtype))
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
  if extra_files_from:
    copy_extra_files(extra_files_from, out_dir)
  return hf


# ---------------------------------------------------------------- sharded orbax

ORBAX_STATE = "state"


def _abstract_states(m):
  """(params, rest) as nnx States of ShapeDtypeStructs, with their logical-axis metadata."""
  from moejax.models.decoder import skeleton_decoder

  model = nnx.eval_shape(lambda: skeleton_decoder(m, rngs=nnx.Rngs(0)))
  _, params, rest = nnx.split(model, nnx.Param, ...)
  return params, rest


def mesh_layout(mesh_sizes: dict | None):
  """A sharding.Layout over all devices with the default logical-axis rules
  (mesh_sizes: {'fsdp': 2, 'expert': 4, ...}, -1 for the rest); None on one device."""
  import jax
  from moejax import sharding

  if not mesh_sizes:
    return None
  sizes = {a: 1 for a in sharding.MESH_AXES}
  sizes.update(mesh_sizes)
  sizes = sharding.mesh_shape(sizes, jax.device_count())
  return sharding.Layout(sharding.make_mesh(sizes), sharding.parse_rules({}))


def orbax_target(m, layout, param_dtype: str = "float32"):
  """{'params', 'rest'} of ShapeDtypeStructs with their shardings on `layout`
  (one device without one): what import_to_orbax writes, load_orbax reads."""
  import jax
  from moejax import sharding

  params, rest = _abstract_states(m)
  dtype = np.dtype(PARAM_DTYPES[param_dtype])
  out = {}
  for name, state in (("params", params), ("rest", rest)):
    shapes = nnx.to_pure_dict(state)
    if layout is None:
      device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      shards = jax.tree.map(lambda _: device, shapes)
    else:
      shards = sharding.tree_shardings(layout, sharding.logical_axes_of(state), shapes)
    out[name] = jax.tree.map(
      lambda s, sh, coll=name: jax.ShapeDtypeStruct(
        s.shape, dtype if coll == "params" else s.dtype, sharding=sh
      ),
      shapes,
      shards,
    )
  return out


def _orbax_keys(tree):
  """Layer indices as strings (orbax stores dict keys as strings)."""
  if isinstance(tree, dict):
    return {str(k): _orbax_keys(v) for k, v in tree.items()}
  return tree


def _sharded_leaf(reader, tm, spec):
  """The jax.Array of one TensorMap in spec's sharding: each addressable shard made
  from the HF tensors it covers (one expert's tensor for each expert in it)."""
  import jax

  dtype = np.dtype(spec.dtype)
  hf_shape = tm.hf_shape(spec.shape)
  read = {}

  def tensor(name):  # each HF tensor read once per leaf, only if a local shard needs it
    if name not in read:
      array = reader.read(name, hf_shape, dtype)
      read[name] = array.T if tm.transpose else array
    return read[name]

  def shard(index):
    if not tm.stacked:
      return tensor(tm.hf_names[0])[index]
    experts = range(*index[0].indices(spec.shape[0]))
    return np.stack([tensor(tm.hf_names[e])[index[1:]] for e in experts])

  return jax.make_array_from_callback(tuple(spec.shape), spec.sharding, shard)


def import_to_orbax(
  hf_dir: str,
  directory: str,
  layout=None,
  param_dtype: str = "float32",
  *,
  max_group_bytes: int = 128 << 20,
):
  """An orbax checkpoint of the HF directory's {'params', 'rest'}, each array in its
  sharding on `layout` (mesh_layout; None: one device), written a few arrays at a
  time (orbax's partial save, one call per max_group_bytes of arrays, or per array
  when larger; then finalize: one checkpoint). Memory: about three times the
  largest group (the arrays, orbax's host copy, its write buffers). Only this process's
  shards are read: with experts split over the mesh, a host reads its experts'
  tensors. Also writes directory/config.json ({'model', 'hf_config'}). Returns m."""
  import orbax.checkpoint.experimental.v1 as ocp

  if param_dtype not in PARAM_DTYPES:
    raise ConfigError(f"param_dtype={param_dtype!r}; valid: {', '.join(PARAM_DTYPES)}")
  hf, m = _config_from_hf(hf_dir)
  target = orbax_target(m, layout, param_dtype)
  maps = tensor_maps(m)
  reader = SafetensorsReader(hf_dir)
  for tm in maps:  # every tensor present, of its shape and a readable dtype, before writing
    for name in tm.hf_names:
      reader._checked_shape(name, tm.hf_shape(_leaf(target, tm).shape))  # noqa: SLF001 - own check
  groups: list[list] = [[]]  # consecutive TensorMaps, up to max_group_bytes a save
  size = 0
  for tm in maps:
    spec = _leaf(target, tm)
    nbytes = int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize
    if groups[-1] and size + nbytes > max_group_bytes:
      groups.append([])
      size = 0
    groups[-1].append(tm)
    size += nbytes
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(os.path.abspath(directory), ORBAX_STATE)
  for group in groups:
    update: dict = {}
    for tm in group:
      node = update.setdefault(tm.collection, {})
      for key in tm.path[:-1]:
        node = node.setdefault(str(key), {})
      node[str(tm.path[-1])] = _sharded_leaf(reader, tm, _leaf(target, tm))
    ocp.partial.save(path, update)
    del update
  ocp.partial.finalize(path)
  reader.close()
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(
      {"model": config_for_params(m, target["params"]).to_dict(), "hf_config": hf}, f, indent=2
    )
  return m


def load_orbax(directory: str, layout=None, param_dtype: str = "float32"):
  """(m, params, rest) of import_to_orbax's checkpoint, restored into `layout`'s
  shardings (any mesh: orbax reshards on load)."""
  import jax
  import orbax.checkpoint.experimental.v1 as ocp

  saved = read_json(os.path.join(directory, "config.json"))
  m = model_config_from_dict(saved["model"])
  target = orbax_target(m, layout, param_dtype)
  stored = {k: v for k, v in _orbax_keys(target).items() if jax.tree.leaves(v)}  # no empty rest
  loaded = ocp.load(os.path.join(os.path.abspath(directory), ORBAX_STATE), stored)

  def back(tree, like):  # string layer keys back to the tree's own
    if isinstance(like, dict):
      return {k: back(tree[str(k)], v) for k, v in like.items()}
    return tree

  return m, back(loaded["params"], target["params"]), back(loaded.get("rest", {}), target["rest"])
