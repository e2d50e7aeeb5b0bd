r"""Train a moejax model from a config file.

  python -m experiments.train --config=configs/lm_shakespeare_moe.py \
      --workdir=runs/default [--config.train.steps=500]

Re-running with the same --workdir resumes from its latest checkpoint.
"""
from absl import app, flags, logging
from ml_collections import config_flags

from moejax.train.loop import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:arg].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
_STOP_AT = flags.DEFINE_integer("stop_at_step", None,
                                "Stop after this step with a checkpoint (resume later).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  # orbax logs every save at INFO; --verbosity=0 brings them back.
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  run = train_and_evaluate(_CONFIG.value, _WORKDIR.value, stop_at_step=_STOP_AT.value)
  logging.info("final eval: %s", run.eval)
  print(f"final: val_loss={run.eval.get('val_loss', float('nan')):.4f} "
        f"val_bpb={run.eval.get('val_bpb', float('nan')):.4f} "
        f"tokens/s={run.tokens_per_second:.0f}")


if __name__ == "__main__":
  app.run(main)
