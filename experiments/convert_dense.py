r"""Convert a trained dense model into an MoE whose experts partition its FFNs.

  python -m experiments.convert_dense --workdir=runs/zoo/s_dense --experts=8 --top_k=3 \
      --partition=trajectory --out=runs/prism/s_trajectory

--workdir: a dense training workdir (its latest checkpoint). Each FFN's hidden
neurons are split into --experts equal groups (--experts must divide d_ff) by
--partition: random, kmeans_lloyd / kmeans_hartigan (MoEfication: balanced
k-means of the neurons' gate columns) or trajectory (Prism-MoE: partition and
router fitted to --trajectories sequences of --length tokens the dense model
generates with --seed); all experts with unit gates equal the dense FFN. The MoE
routes --top_k of them per token. --out: a training workdir (new or empty, not
inside --workdir) at step 0 that experiments.train continues for --budget of the
dense run's steps, with conversion.json (KL to the dense model and FFN output
error on held-out trajectories). See moejax/conversion/ and
configs/studies/prism_moe.py.
"""

from absl import flags

from moejax import cli, cli_files
from moejax.conversion.partition import KINDS

_WORKDIR = flags.DEFINE_string("workdir", None, "The dense training workdir to read from.")
_EXPERTS = cli.checked(flags.DEFINE_integer("experts", 8, "Experts per layer."), cli.at_least(1))
_TOP_K = cli.checked(flags.DEFINE_integer("top_k", 3, "Experts each token uses."), cli.at_least(1))
_PARTITION = flags.DEFINE_enum(
  "partition", "trajectory", list(KINDS), "How the neurons are split into experts."
)
_SEED = cli.checked(
  flags.DEFINE_integer("seed", 0, "Seed of the partition and of the trajectories, in [0, 2**31)."),
  cli.in_range(0, 2**31 - 1),
)
_TRAJECTORIES = cli.checked(
  flags.DEFINE_integer("trajectories", 16, "Generated sequences to fit on."), cli.at_least(1)
)
_LENGTH = cli.checked(
  flags.DEFINE_integer("length", 64, "Tokens per generated sequence."), cli.at_least(1)
)
_BUDGET = cli.checked(
  flags.DEFINE_float(
    "budget", 0.1, "Fraction of the dense run's steps the MoE trains for, in (0, 1]."
  ),
  cli.in_range(0.0, 1.0, low_open=True),
)
_OUT = flags.DEFINE_string("out", None, "Write the MoE's training workdir here (new or empty).")
flags.mark_flags_as_required(["workdir", "out"])


def main(argv):
  del argv
  if _TOP_K.value > _EXPERTS.value:
    raise cli.flag_error(_TOP_K, f"top_k must be <= --experts={_EXPERTS.value}")
  cli_files.existing_workdir("workdir", _WORKDIR.value, kinds=("training",))
  cli_files.output_dir("out", _OUT.value, empty=True, not_inside=[("--workdir", _WORKDIR.value)])
  from moejax.conversion.convert import check_source, convert_workdir
  from moejax.posttrain.source import training_config

  model = training_config(_WORKDIR.value)[0].model
  check_source(
    model, _EXPERTS.value, _TOP_K.value, f"--workdir={_WORKDIR.value}, --experts={_EXPERTS.value}"
  )
  report = convert_workdir(
    _WORKDIR.value,
    _OUT.value,
    _PARTITION.value,
    _EXPERTS.value,
    _TOP_K.value,
    seed=_SEED.value,
    trajectories=_TRAJECTORIES.value,
    length=_LENGTH.value,
    budget=_BUDGET.value,
  )
  held = report["held_out"]
  print(
    f"{_PARTITION.value}: {_EXPERTS.value} experts, top-{_TOP_K.value}; held-out KL to "
    f"the dense model {held['kl']:.4f} nats/token, FFN output MSE {held['mse']:.4g}; "
    f"{report['train_steps']} training steps -> {_OUT.value}"
  )


if __name__ == "__main__":
  cli.run(main)
