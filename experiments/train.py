r"""Train a moejax model from a config file.

  python -m experiments.train --config=configs/lm_shakespeare_moe.py \
      --workdir=runs/default [--config.train.steps=500]

Re-running with the same --workdir resumes from its latest checkpoint.

Many devices or hosts: set the mesh in the config (--config.mesh.expert=4 ...)
and, on GPU nodes, --coordinator_address=HOST:PORT --num_processes=N
--process_id=I on every process; on TPU VMs and under SLURM (srun) JAX finds
its peers itself. See docs/scale_out.md.
"""
import jax
from absl import app, flags, logging
from ml_collections import config_flags

from moejax.train import distributed
from moejax.train.loop import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:arg].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
_STOP_AT = flags.DEFINE_integer("stop_at_step", None,
                                "Stop after this step with a checkpoint (resume later).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "HOST:PORT of process 0 (multi-process runs).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", distributed.DISTRIBUTED_MODES,
    "auto: join a multi-process job when the flags above are set or a SLURM job step or "
    "TPU VM is detected; on: always call jax.distributed.initialize(); off: never.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  # orbax logs every save at INFO; --verbosity=0 brings them back.
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         _DISTRIBUTED.value)
  run = train_and_evaluate(_CONFIG.value, _WORKDIR.value, stop_at_step=_STOP_AT.value)
  logging.info("final eval: %s", run.eval)
  if jax.process_index() == 0:
      print(f"final: val_loss={run.eval.get('val_loss', float('nan')):.4f} "
          f"val_bpb={run.eval.get('val_bpb', float('nan')):.4f} "
          f"tokens/s={run.tokens_per_second:.0f}")


if __name__ == "__main__":
  app.run(main)
