"""Timing, compiled-program and machine figures shared by the benchmarks
(experiments/benchmarks/).

The machine they run on is shared and noisy, so a figure is a median over
repetitions, and the paths a benchmark compares run interleaved: round r runs
every path once, in an order rotated by r (`interleaved_times`); a ratio is taken
against the reference path of the same rounds. Compiled figures are XLA's static
ones (`memory_analysis`, `cost_analysis`): deterministic for a given program.
"""

import os
import platform
import time

import numpy as np


def blocked_times(fn, calls: int) -> list:
  """Wall seconds of fn() with its result waited for, one call at a time."""
  import jax

  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def calls_per_round(fn, seconds: float, most: int) -> int:
  """How many back-to-back calls of fn last about `seconds` (1 to `most`), from one
  call timed after a first, untimed one."""
  blocked_times(fn, 1)
  once = blocked_times(fn, 1)[0]
  return int(np.clip(round(seconds / max(once, 1e-9)), 1, most))


def interleaved_times(fns: dict, reps, inner=None) -> dict:
  """{name: [seconds per call, one per round it ran]} of fns {name: fn}.

  Round r runs every fn once, in the dict's order rotated by r, if r is below its
  repetitions (`reps`: an int, or {name: int}); a round's figure is the mean of
  inner[name] back-to-back calls (default 1), each waited for."""
  names = list(fns)
  reps_of = reps if isinstance(reps, dict) else dict.fromkeys(names, reps)
  inner = inner or {}
  times: dict[str, list[float]] = {name: [] for name in names}
  for round_ in range(max(reps_of.values(), default=0)):
    shift = round_ % len(names)
    for name in names[shift:] + names[:shift]:
      if round_ < reps_of[name]:
        calls = inner.get(name, 1)
        times[name].append(sum(blocked_times(fns[name], calls)) / calls)
  return times


def medians(samples: dict) -> dict:
  """{name: median of its samples}."""
  return {name: float(np.median(values)) for name, values in samples.items()}


def with_backward(fn):
  """fn(params, x) -> (y, aux) as (params, x, dy) -> (gradients for params and x at
  the cotangent dy of y (zeros for aux), aux): a forward + backward pass."""
  import jax
  import jax.numpy as jnp

  def fwd_bwd(params, x, dy):
    (_, aux), vjp = jax.vjp(fn, params, x)
    return vjp((dy, jax.tree.map(jnp.zeros_like, aux))), aux

  return fwd_bwd


def compile_pass(fn, params, x, which: str):
  """(compiled, its arguments, its temp bytes) of fn(params, x) -> (y, aux): 'fwd'
  the forward alone, else forward + backward (`with_backward`, dy = 1 / x.size)."""
  import jax
  import jax.numpy as jnp

  args: tuple
  if which == "fwd":
    jitted, args = jax.jit(fn), (params, x)
  else:
    jitted, args = jax.jit(with_backward(fn)), (params, x, jnp.ones_like(x) / x.size)
  compiled = jitted.lower(*args).compile()
  return compiled, args, compiled_figures(compiled)["temp_bytes"]


def compiled_figures(compiled) -> dict:
  """XLA's static figures of a compiled program: memory_analysis() temp, argument
  and output bytes; cost_analysis() flops and bytes accessed (nan if not given)."""
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {
    "temp_bytes": int(memory.temp_size_in_bytes),
    "argument_bytes": int(memory.argument_size_in_bytes),
    "output_bytes": int(memory.output_size_in_bytes),
    "flops": float(cost.get("flops", float("nan"))),
    "bytes_accessed": float(cost.get("bytes accessed", float("nan"))),
  }


def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo), else platform.processor()."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def machine() -> dict:
  """CPU model, cores, memory (GB, 1e9 bytes), Python and platform."""
  memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return {
    "cpu": cpu_model(),
    "cores": os.cpu_count(),
    "memory_gb": round(memory / 1e9, 1),
    "python": platform.python_version(),
    "platform": platform.platform(),
  }
