"""The seed-batched training benchmark's arms (experiments/benchmarks/seed_batched.py):
S seeds' jitted train steps one after the other against one jax.vmap of the same
step over the stacked states, on synthetic random-token batches; the check that both
give every seed the same state, the interleaved timed windows and the totals table.
"""

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moejax.evaluation.stats import markdown_table
from moejax.train import step as step_lib
from moejax.train.loop import init_state
from moejax.train.sweep import apply_overrides, load_config_file

POOL = 4  # distinct synthetic batches per seed, cycled


def stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def fresh(tree):
  """Host copy -> new device buffers (the jitted steps donate their state)."""
  return jax.tree.map(jnp.asarray, tree)


def setup(config_file: str, overrides, seeds):
  """Per seed: (config, graphdef, host state, optimizer, batches [POOL]) of the config
  file with `overrides` (sweep syntax) and config.seed = the seed."""
  runs = []
  for seed in seeds:
    config = load_config_file(config_file)
    apply_overrides(config, overrides)
    config.seed = seed
    graphdef, state, optimizer = init_state(config)
    rng = np.random.default_rng(1000 + seed)
    shape = (config.data.batch_size, config.data.seq_len + 1)
    tokens = rng.integers(0, config.model.vocab_size, (POOL, *shape), dtype=np.int32)
    batches = [{"inputs": jnp.asarray(t[:, :-1]), "targets": jnp.asarray(t[:, 1:])} for t in tokens]
    runs.append((config, graphdef, jax.device_get(state), optimizer, batches))
  return runs


def timed(fn):
  """(wall seconds of fn(), its result)."""
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


@dataclasses.dataclass
class Arms:
  """The two compiled arms and their inputs: one step per seed (its key a constant of
  its program), and the vmapped step over the stacked states, batches and keys."""

  separate: list
  vmapped: Any
  keys: Any
  stacked_batches: list
  host_stacked: Any
  compile_separate: float  # seconds to lower + compile one seed's step
  compile_vmapped: float


def compile_arms(runs) -> Arms:
  """Both arms compiled from `setup`'s runs, each timed (lower + compile)."""
  config, graphdef, _, optimizer, _ = runs[0]
  t = config.train
  separate = [
    step_lib.make_train_step(graphdef, opt, cfg.seed, None, t.micro_batches, t.balance_statistics)
    for cfg, _, _, opt, _ in runs
  ]
  state0, batch0 = fresh(runs[0][2]), runs[0][4][0]
  compile_separate, first = timed(lambda: separate[0].lower(state0, batch0).compile())
  compiled_separate = [first] + [s.lower(state0, batch0).compile() for s in separate[1:]]
  step_fn = step_lib.train_step_fn(graphdef, optimizer, t.micro_batches, t.balance_statistics)
  vmapped = jax.jit(jax.vmap(step_fn), donate_argnums=0)
  keys = jnp.stack([jax.random.key(cfg.seed) for cfg, *_ in runs])
  stacked_batches = [stack([run[4][i] for run in runs]) for i in range(POOL)]
  host_stacked = jax.device_get(stack([run[2] for run in runs]))
  compile_vmapped, compiled_vmapped = timed(
    lambda: vmapped.lower(fresh(host_stacked), stacked_batches[0], keys).compile()
  )
  return Arms(
    compiled_separate,
    compiled_vmapped,
    keys,
    stacked_batches,
    host_stacked,
    compile_separate,
    compile_vmapped,
  )


def same_states(runs, arms: Arms, steps: int = 3):
  """(per-seed states, stacked state, per seed the largest |difference| over all leaves,
  largest |param| of seed 0) after `steps` steps of each arm from the same start."""
  states = [fresh(run[2]) for run in runs]
  stacked = fresh(arms.host_stacked)
  for i in range(steps):
    states = [arms.separate[s](states[s], runs[s][4][i])[0] for s in range(len(runs))]
    stacked = arms.vmapped(stacked, arms.stacked_batches[i], arms.keys)[0]
  diffs = [
    max(
      float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))))
      for a, b in zip(
        jax.tree.leaves(states[s]), jax.tree.leaves(jax.tree.map(lambda x: x[s], stacked))
      )
    )
    for s in range(len(runs))
  ]
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(states[0].params))
  return states, stacked, diffs, scale


def step_windows(runs, arms: Arms, states, stacked, window: int, windows: int):
  """Seconds per step of each arm (separate: per seed step), one figure per timed
  window of `window` steps, the arms' windows interleaved; a first window warms up."""
  per_separate, per_vmapped = [], []
  for w in range(windows + 1):
    start = time.perf_counter()
    for s in range(len(runs)):
      for i in range(window):
        states[s], _ = arms.separate[s](states[s], runs[s][4][i % POOL])
      jax.block_until_ready(states[s])
    seconds_separate = (time.perf_counter() - start) / (window * len(runs))
    start = time.perf_counter()
    for i in range(window):
      stacked, _ = arms.vmapped(stacked, arms.stacked_batches[i % POOL], arms.keys)
    jax.block_until_ready(stacked)
    seconds_vmapped = (time.perf_counter() - start) / window
    if w:
      per_separate.append(seconds_separate)
      per_vmapped.append(seconds_vmapped)
  return per_separate, per_vmapped


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
