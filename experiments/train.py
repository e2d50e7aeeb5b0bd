r"""Train a moejax model from a config file.

  python -m experiments.train --config=configs/lm_shakespeare_moe.py \
      --workdir=runs/default [--config.train.steps=500]

Re-running with the same --workdir resumes from its latest checkpoint.

Many devices or hosts: set the mesh in the config (--config.mesh.expert=4 ...)
and, on GPU nodes, --coordinator_address=HOST:PORT --num_processes=N
--process_id=I on every process; on TPU VMs and under SLURM (srun) JAX finds
its peers itself. See docs/scale_out.md.
"""

import os

import jax
from absl import flags, logging
from ml_collections import config_flags

from moejax import cli, cli_files
from moejax.errors import ConfigError
from moejax.validation import validate_config
from moejax.train import distributed
from moejax.train.checkpoint import Checkpointer, jsonable
from moejax.train.init_from import resolve_config
from moejax.train.loop import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Experiment config file[:arg].", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
_STOP_AT = cli.checked(
  flags.DEFINE_integer(
    "stop_at_step", None, "Stop after this step with a checkpoint (resume later)."
  ),
  cli.at_least(1),
)
_COORDINATOR = cli.checked(
  flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0 (multi-process runs)."),
  cli.host_port(),
)
_NUM_PROCESSES = cli.checked(
  flags.DEFINE_integer("num_processes", None, "Processes in the job."), cli.at_least(1)
)
_PROCESS_ID = cli.checked(
  flags.DEFINE_integer("process_id", None, "This process's index."), cli.at_least(0)
)
_ALLOW_MIXED = flags.DEFINE_bool(
  "allow_mixed",
  False,
  "Train into a workdir that already holds an imported model (experiments.convert).",
)
_DISTRIBUTED = flags.DEFINE_enum(
  "distributed",
  "auto",
  distributed.DISTRIBUTED_MODES,
  "auto: join a multi-process job when the flags above are set or a SLURM job step or "
  "TPU VM is detected; on: always call jax.distributed.initialize(); off: never.",
)
flags.mark_flags_as_required(["config", "workdir"])


def check_process_flags() -> None:
  """The multi-process flags, checked before jax.distributed.initialize (which must
  come before any JAX call, device counts included)."""
  if (
    _PROCESS_ID.value is not None
    and _NUM_PROCESSES.value is not None
    and _PROCESS_ID.value >= _NUM_PROCESSES.value
  ):
    raise cli.flag_error(
      _PROCESS_ID, f"expected an index below --num_processes={_NUM_PROCESSES.value}"
    )


def check_inputs(config, workdir: str) -> None:
  """Everything refusable before the run creates, writes or compiles anything
  (after distributed.initialize: the mesh checks count devices)."""
  config = resolve_config(config)
  validate_config(config)
  if _STOP_AT.value is not None and _STOP_AT.value > config.train.steps:
    raise cli.flag_error(_STOP_AT, f"expected a step <= train.steps={config.train.steps}")
  cli_files.writable_workdir("workdir", workdir, "training", allow_mixed=_ALLOW_MIXED.value)
  cli_files.output_dir("workdir", workdir, not_inside=[("init.hf_dir", config.init.get("hf_dir"))])
  if cli_files.workdir_kind(workdir) in ("training", "mixed") and os.path.isdir(
    os.path.join(workdir, "checkpoints")
  ):
    ckpt = Checkpointer(workdir, read_only=True)
    latest = ckpt.latest_step()
    if latest is not None:
      ckpt.check_compatible(latest, {"config": jsonable(config.to_dict())})
    ckpt.close()


def main(argv):
  del argv
  check_process_flags()
  distributed.initialize(
    _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _DISTRIBUTED.value
  )
  check_inputs(_CONFIG.value, _WORKDIR.value)
  before = cli_files.workdir_kind(_WORKDIR.value)
  try:
    run = train_and_evaluate(_CONFIG.value, _WORKDIR.value, stop_at_step=_STOP_AT.value)
  except ConfigError:  # refused while loading (a damaged init.hf_dir): leave no new workdir
    if before in ("missing", "empty") and jax.process_index() == 0:
      cli_files.undo_new_workdir(_WORKDIR.value, before)
    raise
  logging.info("final eval: %s", run.eval)
  if jax.process_index() == 0:
    # lm: val_loss, val_bpb; classification: val_loss, val_accuracy (moejax/train/tasks.py)
    scores = run.eval or {"val_loss": float("nan"), "val_bpb": float("nan")}
    print(
      "final: "
      + " ".join(f"{key}={value:.4f}" for key, value in scores.items())
      + f" tokens/s={run.tokens_per_second:.0f}"
    )


if __name__ == "__main__":
  cli.run(main)
