r"""Construction of a scanned decoder's stacked blocks: the Python loop that builds
every block and stacks their states, against nnx.vmap over rngs split per layer
(moejax/models/scanned.py ScannedBlocks), for a deep model (DeepSeek-V3's 61 layers).

  python -m experiments.benchmarks.scan_init [--layers=61] [--d_model=64]
      [--experts=8] [--repeats=5] [--memory]

Both arms are timed in one process, interleaved (the machine is shared, so the
ratio is the figure): trace seconds = nnx.eval_shape of the blocks' construction
(shapes only: the Python and tracing work of building them, nothing allocated),
the median of --repeats after one untimed warm-up each. With --memory, each
construction is also jitted, lowered and compiled once: compile seconds and
compiled.memory_analysis() of the init program (temp and output bytes). The rest
of the model (embedding, norm, head) is built the same way in both: left out.

The figures: docs/results/scan_construction_cpu.md.
"""

import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
from absl import app, flags
from flax import nnx

from moejax.configs.lm_shakespeare_moe import get_config
from moejax.evaluation.stats import markdown_table
from moejax.models.block import DecoderBlock
from moejax.models.scanned import ScannedBlocks, stack

_LAYERS = flags.DEFINE_integer("layers", 61, "Decoder layers (DeepSeek-V3: 61).")
_D_MODEL = flags.DEFINE_integer("d_model", 64, "Model width.")
_EXPERTS = flags.DEFINE_integer("experts", 8, "Routed experts per MoE layer.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Tracings per arm (median).")
_MEMORY = flags.DEFINE_bool("memory", True, "Also compile each init once: seconds, bytes.")


def model_config() -> ml_collections.FrozenConfigDict:
  """size=tiny with --layers identical MoE layers of width --d_model, --experts experts."""
  m = get_config("size=tiny").model
  m.num_layers, m.d_model, m.moe.num_experts = _LAYERS.value, _D_MODEL.value, _EXPERTS.value
  m.scan_layers = True
  return ml_collections.FrozenConfigDict(m)


def loop_then_stack(m, rngs: nnx.Rngs) -> nnx.Module:
  """The stacked block as ScannedBlocks built it before nnx.vmap: every block built in
  a Python loop, their states stacked into block 0, the layer axis (None) put in front
  of each variable's logical_axes."""
  blocks = [DecoderBlock(m, i, rngs=rngs, dtype=jnp.float32) for i in range(m.num_layers)]
  block = blocks[0]
  nnx.update(block, stack([nnx.state(b) for b in blocks]))
  for _, variable in nnx.iter_graph(block):
    if isinstance(variable, nnx.Variable):
      axes = variable.get_metadata().get("logical_axes")
      if axes is not None:
        variable.set_metadata(logical_axes=(None, *axes))
  return block


def vmapped(m, rngs: nnx.Rngs) -> nnx.Module:
  """The stacked block of ScannedBlocks: nnx.vmap over split rngs."""
  return ScannedBlocks(m, rngs=rngs, dtype=jnp.float32).block


ARMS = {"loop + stack": loop_then_stack, "nnx.vmap": vmapped}


def trace_seconds(build, m) -> float:
  start = time.perf_counter()
  nnx.eval_shape(lambda: build(m, nnx.Rngs(0)))
  return time.perf_counter() - start


def compiled_init(build, m) -> tuple[float, int, int]:
  """(lower + compile seconds, temp bytes, output bytes) of the jitted construction."""

  def init():
    return nnx.state(build(m, nnx.Rngs(0)))

  start = time.perf_counter()
  compiled = jax.jit(init).lower().compile()
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  return seconds, memory.temp_size_in_bytes, memory.output_size_in_bytes


def main(argv):
  del argv
  m = model_config()
  for build in ARMS.values():  # warm-up, untimed: JAX's own first-use costs
    trace_seconds(build, m)
  times: dict[str, list[float]] = {name: [] for name in ARMS}
  for _ in range(_REPEATS.value):
    for name, build in ARMS.items():
      times[name].append(trace_seconds(build, m))
  medians = {name: statistics.median(t) for name, t in times.items()}
  compiled = {}
  if _MEMORY.value:
    compiled = {name: compiled_init(build, m) for name, build in ARMS.items()}
  print(
    f"{m.num_layers} layers, d_model {m.d_model}, {m.moe.num_experts} experts, "
    f"{_REPEATS.value} repeats, jax {jax.__version__}, {jax.devices()[0].platform}"
  )
  print(table(times, medians, compiled))
  loop, new = medians["loop + stack"], medians["nnx.vmap"]
  print(f"trace time loop + stack / nnx.vmap: {loop / new:.1f}x")


def table(times, medians, compiled) -> str:
  """Markdown: per arm the median trace seconds, its range, the ratio to nnx.vmap, and
  (with --memory) the compiled init's seconds and bytes."""
  header = ["construction", "trace s (median)", "min-max", "vs nnx.vmap"]
  if compiled:
    header += ["compile s", "temp MiB", "output MiB"]
  rows = []
  for name, median in medians.items():
    row = [
      name,
      f"{median:.3f}",
      f"{min(times[name]):.3f}-{max(times[name]):.3f}",
      f"{median / medians['nnx.vmap']:.1f}",
    ]
    if compiled:
      seconds, temp, output = compiled[name]
      row += [f"{seconds:.2f}", f"{temp / 2**20:.2f}", f"{output / 2**20:.2f}"]
    rows.append(row)
  return markdown_table(header, rows)


if __name__ == "__main__":
  app.run(main)
