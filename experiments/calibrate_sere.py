r"""SERE's offline step: expert similarity (linear CKA) per MoE layer of a trained model.

  python -m experiments.calibrate_sere --workdir=runs/moe  # -> runs/moe/sere_similarity.npy
  python -m experiments.generate --workdir=runs/moe --prompt=ROMEO: --prompt=JULIET: \
      --sere_similarity=runs/moe/sere_similarity.npy --sere_rho=0.3

Runs every expert of each MoE layer on the MoE inputs of --batches training
batches (moejax/analysis/router_inference.py:calibrate_similarity) and saves a
float32 [MoE layers, E, E] array; generation with --sere_similarity decodes
with SERE re-routing (moejax/routing/sere.py) at threshold --sere_rho.
"""

import os

from absl import flags
import numpy as np

from moejax import cli, cli_files
from moejax.errors import ConfigError

from moejax.analysis.router_inference import calibrate_similarity
from moejax.data.pipeline import build_lm_data
from moejax.train.restore import load_from_workdir

_WORKDIR = flags.DEFINE_string("workdir", None, "A trained MoE LM's workdir.")
_BATCHES = cli.checked(
  flags.DEFINE_integer("batches", 2, "Training batches of calibration tokens."), cli.at_least(1)
)
_OUT = flags.DEFINE_string("out", None, "Output .npy (default WORKDIR/sere_similarity.npy).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv
  cli_files.existing_workdir("workdir", _WORKDIR.value, kinds=("training", "mixed"))
  out = (
    _OUT.value if _OUT.value is not None else os.path.join(_WORKDIR.value, "sere_similarity.npy")
  )
  cli_files.output_file("out", out, suffixes=(".npy",))  # np.save appends .npy to other names
  config, graphdef, params, rest, _ = load_from_workdir(_WORKDIR.value)
  if config.model.ffn_type != "moe":
    raise ConfigError(
      f"model.ffn_type={config.model.ffn_type!r}: SERE calibrates the experts "
      f"of an MoE model (--workdir={_WORKDIR.value})"
    )
  data = build_lm_data(config.data, seed=config.seed)
  tokens = np.concatenate([next(data.train_iter)["inputs"] for _ in range(_BATCHES.value)])
  similarity = np.asarray(calibrate_similarity(graphdef, params, rest, tokens), np.float32)
  np.save(out, similarity)
  off = similarity[:, ~np.eye(similarity.shape[1], dtype=bool)]
  print(
    f"wrote {out}: {similarity.shape[0]} MoE layers x {similarity.shape[1]} experts, "
    f"{tokens.size} calibration tokens; off-diagonal CKA per layer max "
    + ", ".join(f"{v:.2f}" for v in off.max(1))
  )


if __name__ == "__main__":
  cli.run(main)
