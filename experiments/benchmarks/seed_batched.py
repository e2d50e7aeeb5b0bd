r"""Seed-batched training: S seeds in one jax.vmap'ed step against S
separate runs of one config.

  python -m experiments.benchmarks.seed_batched [--config=configs/zoo.py:model=xs]
      [--seeds=3] [--steps=600] [--window=10] [--windows=5] [--override=key=value ...]

Both arms train the config's model (its own init per seed, init_state) on
synthetic random-token batches of the config's shape (data.batch_size x
data.seq_len), so the data pipeline is not what is measured:
  (a) separate   each seed's own jitted step (make_train_step), seeds one after
                 the other;
  (b) vmapped    one jitted jax.vmap of the same step (step.train_step_fn) over
                 the S stacked TrainStates (params, rest = router state, optimizer
                 state, step), each seed its own batch and its own key.
First it checks that one vmapped step gives every seed the state its own step
gives (max abs difference over all leaves). Then, in one process (the machine
is shared, so only the ratios are figures): compile seconds of each program
(lower + compile) and the steady-state step time, the median over --windows
timed windows of --window steps, the two arms' windows interleaved. Totals for
--steps steps per seed:
  S processes                  S x (compile + steps x t_separate)
  one process, sequential      compile + S x steps x t_separate
  vmapped                      compile_vmapped + steps x t_vmapped
(a process's start-up, init and data pipeline are left out of both arms).

The figures, and why the vmapped step is slower on CPU: docs/results/seed_batched_cpu.md.
"""

import statistics

import jax
from absl import app, flags

from moejax.profiling.seed_batched import (
  compile_arms,
  same_states,
  setup,
  step_windows,
  table,
  totals,
)

_CONFIG = flags.DEFINE_string("config", "configs/zoo.py:model=xs", "Config file[:arg].")
_OVERRIDE = flags.DEFINE_multi_string(
  "override", [], "key=value config overrides (sweep syntax), e.g. model.moe.dispatch=capacity."
)
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds S trained together.")
_STEPS = flags.DEFINE_integer("steps", 600, "Run length per seed for the totals.")
_WINDOW = flags.DEFINE_integer("window", 10, "Steps per timed window.")
_WINDOWS = flags.DEFINE_integer("windows", 5, "Timed windows per arm (median).")


def main(argv):
  del argv
  runs = setup(_CONFIG.value, _OVERRIDE.value, range(_SEEDS.value))
  arms = compile_arms(runs)
  states, stacked, diffs, scale = same_states(runs, arms)
  per_separate, per_vmapped = step_windows(
    runs, arms, states, stacked, _WINDOW.value, _WINDOWS.value
  )
  t_sep, t_vmap = statistics.median(per_separate), statistics.median(per_vmapped)
  compile_separate, compile_vmapped = arms.compile_separate, arms.compile_vmapped

  n, S = _STEPS.value, len(runs)
  total_processes, _, total_vmapped = totals(S, n, compile_separate, t_sep, compile_vmapped, t_vmap)
  m, d = runs[0][0].model, runs[0][0].data
  print(
    f"{_CONFIG.value} {' '.join(_OVERRIDE.value)}: d {m.d_model}, {m.num_layers} layers, "
    f"{m.moe.num_experts} experts "
    f"top-{m.moe.top_k}, router {m.moe.router}, dispatch {m.moe.dispatch} "
    f"({m.moe.grouped_matmul}); batch "
    f"{d.batch_size} x {d.seq_len}; S={S} seeds; jax {jax.__version__}, "
    f"{jax.devices()[0].platform}"
  )
  print(
    "vmapped vs separate after 3 steps, max abs diff per seed: "
    + ", ".join(f"{x:.2e}" for x in diffs)
    + f" (largest |param| {scale:.2f})"
  )
  print(
    f"per-step windows (s): separate {', '.join(f'{x:.4f}' for x in per_separate)}; "
    f"vmapped {', '.join(f'{x:.4f}' for x in per_vmapped)}"
  )
  print(table(S, n, compile_separate, t_sep, compile_vmapped, t_vmap))
  print(
    f"steady-state step ratio vmapped / (S x separate): {t_vmap / (S * t_sep):.2f}; "
    f"compile ratio vmapped / separate: {compile_vmapped / compile_separate:.2f}; "
    f"total ratio vmapped / S processes: {total_vmapped / total_processes:.2f}"
  )


if __name__ == "__main__":
  app.run(main)
