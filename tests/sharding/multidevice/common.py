"""Builders shared by the sessions that run on 8 simulated CPU devices.

These modules (on8_*.py) are collected only by the subprocess sessions that
tests/sharding/test_on_8_devices.py starts with
XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

import jax

from moejax.configs import lm_shakespeare_moe
from moejax import sharding

if jax.device_count() != 8:
  raise RuntimeError(
    "run through tests/sharding/test_on_8_devices.py: these checks need "
    "XLA_FLAGS=--xla_force_host_platform_device_count=8"
  )

MESHES = {  # the acceptance meshes, by name
  "data8": dict(data=8),
  "data2_expert4": dict(data=2, expert=4),
  "fsdp2_expert2_tensor2": dict(data=1, fsdp=2, expert=2, tensor=2),
}


def tiny_config(data_dir=None, arg="", mesh=None, **train):
  """The tiny LM config (8 experts, top-2), on `mesh` (None: one device)."""
  c = lm_shakespeare_moe.get_config(",".join(filter(None, ["size=tiny", arg])))
  c.data.data_dir = data_dir
  c.train.progress_bar = False
  for axis, size in (mesh or dict(data=1)).items():
    c.mesh[axis] = size
  for key, value in train.items():
    c.train[key] = value
  return c


def layout_for(mesh: dict, all_to_all="fixed", a2a_capacity_factor=0.0) -> sharding.Layout:
  sizes = {axis: mesh.get(axis, 1) for axis in sharding.MESH_AXES}
  return sharding.Layout(
    sharding.make_mesh(sizes), dict(sharding.RULES), all_to_all, a2a_capacity_factor
  )


def one_device():
  return jax.devices()[:1]
