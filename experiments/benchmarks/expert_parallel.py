r"""Expert parallelism on 8 simulated CPU devices against the single-device MoE layer.

  python -m experiments.benchmarks.expert_parallel                     # lm shape
  python -m experiments.benchmarks.expert_parallel --shape=4096:512:256:64:8 --reps=3

One MoE layer (softmax top-k router, SwiGLU experts), forward + backward
(gradients for x, router and expert weights), for T:d:f:E:k tokens and sizes:
  1 device                  the dispatcher on one device (dropless: the 'loop' path)
  <mesh> [a2a factor]       moejax.dispatch.expert_parallel on that mesh of the 8
                            simulated devices (XLA:CPU has no ragged all_to_all,
                            so the exchange is the fixed-capacity one)
Reported per row: median step time and its ratio to the one-device step, the
all_to_all bytes per step per device read from the compiled (partitioned) HLO,
the rows each exchange moves per device (the buffer, n_ep * R) against the
rows routed there on average (T_local * k), and the fraction of assignments
the exchange dropped. The 8 "devices" share this machine's cores, so the
ratio shows the cost of partitioning and exchange, not a speed-up.
"""

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()

from absl import app, flags  # noqa: E402  (after XLA_FLAGS is set)

from moejax import cli, cli_files  # noqa: E402  (after XLA_FLAGS is set)
from moejax.profiling.expert_parallel import MESHES, bench, markdown  # noqa: E402  (after XLA_FLAGS is set)

_SHAPE = flags.DEFINE_string("shape", "4096:128:256:8:2", "T:d:f:E:k (default: the LM's layer).")
_DISPATCH = flags.DEFINE_list("dispatch", ["dropless", "capacity"], "Dispatch paths.")
_MESHES = flags.DEFINE_list("meshes", ["data2_expert4", "expert8"], f"Of {sorted(MESHES)}.")
_FACTORS = flags.DEFINE_list(
  "a2a_capacity_factors", ["0", "2"], "sharding.a2a_capacity_factor values (0: never overflows)."
)
_REPS = flags.DEFINE_integer("reps", 5, "Interleaved repetitions (median).")
OUTPUTS = cli_files.study_outputs(plot=False)


def main(argv):
  del argv
  _, dims = cli.preset_or_ints(_SHAPE.value, {}, "T:d:f:E:k", "shape")
  unknown = set(_MESHES.value) - set(MESHES)
  if unknown:
    raise app.UsageError(f"unknown --meshes {sorted(unknown)}; valid: {sorted(MESHES)}")
  OUTPUTS.check()
  records = bench(
    dims, _DISPATCH.value, _MESHES.value, [float(f) for f in _FACTORS.value], _REPS.value
  )
  text = markdown(records)
  print(text)
  OUTPUTS.write(records, text)


if __name__ == "__main__":
  cli.run(main)
