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
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from moejax.evaluation.stats import markdown_table
from moejax.train import step as step_lib
from moejax.train.loop import init_state
from moejax.train.sweep import apply_overrides, load_config_file

_CONFIG = flags.DEFINE_string("config", "configs/zoo.py:model=xs", "Config file[:arg].")
_OVERRIDE = flags.DEFINE_multi_string(
  "override", [], "key=value config overrides (sweep syntax), e.g. model.moe.dispatch=capacity."
)
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds S trained together.")
_STEPS = flags.DEFINE_integer("steps", 600, "Run length per seed for the totals.")
_WINDOW = flags.DEFINE_integer("window", 10, "Steps per timed window.")
_WINDOWS = flags.DEFINE_integer("windows", 5, "Timed windows per arm (median).")
_POOL = 4  # distinct synthetic batches per seed, cycled


def stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def fresh(tree):
  """Host copy -> new device buffers (the jitted steps donate their state)."""
  return jax.tree.map(jnp.asarray, tree)


def setup(seeds):
  """Per seed: (config, graphdef, host state, optimizer, batches [POOL])."""
  runs = []
  for seed in seeds:
    config = load_config_file(_CONFIG.value)
    apply_overrides(config, _OVERRIDE.value)
    config.seed = seed
    graphdef, state, optimizer = init_state(config)
    rng = np.random.default_rng(1000 + seed)
    shape = (config.data.batch_size, config.data.seq_len + 1)
    tokens = rng.integers(0, config.model.vocab_size, (_POOL, *shape), dtype=np.int32)
    batches = [{"inputs": jnp.asarray(t[:, :-1]), "targets": jnp.asarray(t[:, 1:])} for t in tokens]
    runs.append((config, graphdef, jax.device_get(state), optimizer, batches))
  return runs


def timed(fn):
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


def totals(S, n, compile_separate, t_sep, compile_vmapped, t_vmap):
  """Seconds for n steps per seed: (S processes, one process sequential, vmapped)."""
  return (
    S * (compile_separate + n * t_sep),
    compile_separate + S * n * t_sep,
    compile_vmapped + n * t_vmap,
  )


def table(S, n, compile_separate, t_sep, compile_vmapped, t_vmap) -> str:
  """Markdown: each arm's compile and step seconds and its total for n steps per seed."""
  processes, sequential, vmapped = totals(S, n, compile_separate, t_sep, compile_vmapped, t_vmap)
  return markdown_table(
    ["arm", "compile s", "step s (S seeds)", f"total s, {n} steps", "vs one process, sequential"],
    [
      [
        f"{S} processes",
        f"{S} x {compile_separate:.1f}",
        f"{S} x {t_sep:.4f}",
        f"{processes:.1f}",
        f"{processes / sequential:.2f}",
      ],
      [
        "one process, sequential",
        f"{compile_separate:.1f}",
        f"{S} x {t_sep:.4f}",
        f"{sequential:.1f}",
        "1.00",
      ],
      [
        "vmapped",
        f"{compile_vmapped:.1f}",
        f"{t_vmap:.4f}",
        f"{vmapped:.1f}",
        f"{vmapped / sequential:.2f}",
      ],
    ],
  )


def main(argv):
  del argv
  seeds = list(range(_SEEDS.value))
  runs = setup(seeds)
  config, graphdef, _, optimizer, _ = runs[0]
  t = config.train

  # (a) separate: one jitted step per seed (its key is a constant of its program).
  separate = [
    step_lib.make_train_step(graphdef, opt, cfg.seed, None, t.micro_batches, t.balance_statistics)
    for cfg, _, _, opt, _ in runs
  ]
  state0, batch0 = fresh(runs[0][2]), runs[0][4][0]
  compile_separate, first = timed(lambda: separate[0].lower(state0, batch0).compile())
  compiled_separate = [first] + [s.lower(state0, batch0).compile() for s in separate[1:]]

  # (b) vmapped: one program over the stacked states, batches and keys.
  step_fn = step_lib.train_step_fn(graphdef, optimizer, t.micro_batches, t.balance_statistics)
  vmapped = jax.jit(jax.vmap(step_fn), donate_argnums=0)
  keys = jnp.stack([jax.random.key(cfg.seed) for cfg, *_ in runs])
  stacked_batches = [stack([run[4][i] for run in runs]) for i in range(_POOL)]
  host_stacked = jax.device_get(stack([run[2] for run in runs]))
  compile_vmapped, compiled_vmapped = timed(
    lambda: vmapped.lower(fresh(host_stacked), stacked_batches[0], keys).compile()
  )

  # Same new state per seed: 3 steps of each arm from the same start.
  states = [fresh(run[2]) for run in runs]
  stacked = fresh(host_stacked)
  for i in range(3):
    states = [compiled_separate[s](states[s], runs[s][4][i])[0] for s in range(len(seeds))]
    stacked = compiled_vmapped(stacked, stacked_batches[i], keys)[0]
  diffs = [
    max(
      float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))))
      for a, b in zip(
        jax.tree.leaves(states[s]), jax.tree.leaves(jax.tree.map(lambda x: x[s], stacked))
      )
    )
    for s in range(len(seeds))
  ]
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(states[0].params))

  # Steady state: interleaved windows of each arm.
  window = _WINDOW.value
  per_separate, per_vmapped = [], []
  for w in range(_WINDOWS.value + 1):  # window 0 warms up
    start = time.perf_counter()
    for s in range(len(seeds)):
      for i in range(window):
        states[s], _ = compiled_separate[s](states[s], runs[s][4][i % _POOL])
      jax.block_until_ready(states[s])
    seconds_separate = (time.perf_counter() - start) / (window * len(seeds))
    start = time.perf_counter()
    for i in range(window):
      stacked, _ = compiled_vmapped(stacked, stacked_batches[i % _POOL], keys)
    jax.block_until_ready(stacked)
    seconds_vmapped = (time.perf_counter() - start) / window
    if w:
      per_separate.append(seconds_separate)
      per_vmapped.append(seconds_vmapped)
  t_sep, t_vmap = statistics.median(per_separate), statistics.median(per_vmapped)

  n, S = _STEPS.value, len(seeds)
  total_processes, _, total_vmapped = totals(S, n, compile_separate, t_sep, compile_vmapped, t_vmap)
  m, d = config.model, config.data
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
