"""Training on a mesh of devices across one or many processes (JAX SPMD, jax.distributed).

initialize   jax.distributed.initialize from explicit flags, or with no arguments
             where JAX can find its peers itself (SLURM, Cloud TPU VMs and pods).
Placement    where the TrainState lives: parameters by their logical axes
             (moejax/sharding.py), optimizer moments like their parameters (so
             FSDP splits them too: ZeRO-3), step and router state replicated;
             batches split over the batch axes. It builds the initial state
             already sharded (jit with out_shardings: no host holds it whole),
             turns each process's rows into one global array, and tells the data
             pipeline which rows this process reads.
Every process runs the same program on the same global arrays; per-process
work (data rows, metric files) follows jax.process_index().
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import jax
import numpy as np
import optax
from absl import logging
from flax import nnx

from moejax import sharding
from moejax.errors import ConfigError
from moejax.train import optimizer as optimizer_lib
from moejax.train import step as step_lib

DISTRIBUTED_MODES = ("auto", "on", "off")


def detected_cluster() -> str | None:
  """'slurm' or 'tpu' where jax.distributed.initialize() finds its peers by itself."""
  env = os.environ
  if (
    "SLURM_JOB_ID" in env and "SLURM_STEP_NODELIST" in env and int(env.get("SLURM_NTASKS", "1")) > 1
  ):
    return "slurm"
  if "," in env.get("TPU_WORKER_HOSTNAMES", "") or "MEGASCALE_COORDINATOR_ADDRESS" in env:
    return "tpu"
  try:  # Cloud TPU VMs (GCE pods keep their peers in the metadata server).
    from jax._src.cloud_tpu_init import running_in_cloud_tpu_vm
  except ImportError:
    return None
  return "tpu" if running_in_cloud_tpu_vm else None


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  mode: str = "auto",
) -> bool:
  """Join the multi-process job; True if jax.distributed was initialized.

  Explicit arguments always initialize (GPU nodes, or any cluster by hand).
  Without them, mode 'auto' initializes where `detected_cluster()` finds a
  SLURM job step or a TPU VM, 'on' always (JAX auto-detects the rest), 'off'
  never. Must run before anything touches a device.
  """
  if mode not in DISTRIBUTED_MODES:
    raise ConfigError(f"--distributed={mode!r} is not one of {', '.join(DISTRIBUTED_MODES)}")
  explicit = (coordinator_address, num_processes, process_id)
  if (
    any(v is not None for v in explicit) or mode == "on" or (mode == "auto" and detected_cluster())
  ):
    jax.distributed.initialize(*explicit)
    logging.info(
      "process %d of %d, %d local of %d devices",
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.device_count(),
    )
    return True
  return False


def process_zero_first(fn):
  """fn() on process 0, then on the others: preparing a dataset is not concurrent-safe."""
  if jax.process_count() == 1:
    return fn()
  from jax.experimental import multihost_utils

  if jax.process_index() == 0:
    out = fn()
  multihost_utils.sync_global_devices("moejax: process 0 prepared")
  if jax.process_index() != 0:
    out = fn()
  return out


def process_rows(batch_sharding, global_shape) -> tuple[int, int]:
  """(shard_index, shard_count): this process's devices hold rows
  [i * B / n, (i + 1) * B / n) of the global batch (what build_lm_data reads)."""
  index_map = batch_sharding.addressable_devices_indices_map(tuple(global_shape))
  rows = sorted({s[0].indices(global_shape[0])[:2] for s in index_map.values()})
  start, stop = rows[0][0], rows[-1][1]
  covered = sum(b - a for a, b in rows)
  if covered != stop - start or global_shape[0] % (stop - start):
    raise ConfigError(
      f"the mesh gives process {jax.process_index()} batch rows {rows}, not "
      "one contiguous equal slice; order the mesh so that the batch axes "
      "span processes (mesh.data across hosts)"
    )
  return start // (stop - start), global_shape[0] // (stop - start)


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where one run's TrainState and batches live on a Layout, and how to make them."""

  layout: sharding.Layout
  graphdef: nnx.GraphDef
  optimizer: optax.GradientTransformation
  init: Callable[[], step_lib.TrainState]  # , traced by jit with out_shardings=state
  state: step_lib.TrainState  # of NamedSharding
  batch: jax.sharding.NamedSharding
  batch_shape: tuple  # global [B, L]

  @property
  def replicated(self):
    return self.layout.replicated

  def init_state(self) -> step_lib.TrainState:
    """The fresh TrainState, created directly in its shards."""
    return jax.jit(self.init, out_shardings=self.state)()

  def data_shard(self) -> dict:
    index, count = process_rows(self.batch, self.batch_shape)
    return {"shard_index": index, "shard_count": count}

  def global_batch(self, local_batch: dict) -> dict:
    """This process's numpy rows -> global arrays split over the batch axes."""
    return {
      k: jax.make_array_from_process_local_data(self.batch, v, self.batch_shape)
      for k, v in local_batch.items()
    }

  def restore_target(self, state_shapes):
    """ShapeDtypeStructs with target shardings: orbax restores into this layout."""
    return jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state_shapes, self.state
    )


def make_placement(config, layout, build_model) -> Placement:
  """Shardings from the parameters' logical axes, found without building the model."""
  abstract = nnx.eval_shape(lambda: build_model(config))
  split = nnx.split(abstract, nnx.Param, ...)
  graphdef, params, rest = split  # type: ignore[misc]  # nnx.split stub: any arity
  optimizer = optimizer_lib.make_optimizer(config.train)

  def init():
    _, p, r = step_lib.split_model(build_model(config))
    return step_lib.TrainState(np.int32(0), p, r, optimizer.init(p))

  shapes = jax.eval_shape(init)
  param_shardings = sharding.tree_shardings(layout, sharding.logical_axes_of(params), shapes.params)
  state_shardings = step_lib.TrainState(
    layout.replicated,
    param_shardings,
    sharding.tree_shardings(layout, sharding.logical_axes_of(rest), shapes.rest),
    optax.tree_map_params(
      optimizer,
      lambda _, s: s,
      shapes.opt_state,
      param_shardings,
      transform_non_params=lambda _: layout.replicated,
    ),
  )
  batch_shape = (config.data.batch_size, config.data.seq_len)
  return Placement(
    layout,
    graphdef,
    optimizer,
    init,
    state_shardings,
    layout.named(("batch", "length"), batch_shape),
    batch_shape,
  )
