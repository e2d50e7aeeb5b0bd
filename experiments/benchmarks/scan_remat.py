r"""Compile time of scan-over-layers vs the loop, and compiled temp memory per
remat policy, for a 24-layer MoE LM's training step (forward + backward).

  python -m experiments.benchmarks.scan_remat [--layers=24] [--batch=8] [--seq=256]

Both figures come from one process, as ratios (the machine is shared):
compile seconds = lower + compile of jax.grad of the loss (median of --repeats
fresh tracings); temp bytes = compiled.memory_analysis().temp_size_in_bytes,
which is deterministic for a given program.
"""

import statistics
import time

import jax
import ml_collections
from absl import app, flags
from flax import nnx

from moejax.configs.lm_shakespeare_moe import get_config
from moejax.evaluation.stats import markdown_table
from moejax.models import Decoder
from moejax.models.decoder import REMAT_POLICIES
from moejax.train.step import cross_entropy, split_model

_LAYERS = flags.DEFINE_integer("layers", 24, "Decoder layers.")
_BATCH = flags.DEFINE_integer("batch", 8, "Rows per batch.")
_SEQ = flags.DEFINE_integer("seq", 256, "Tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Compilations per variant (median).")


def compiled_step(scan: bool, remat: str):
  """(compile seconds, compiled) of the loss gradient for one variant."""
  m = get_config("size=small").model
  m.num_layers, m.scan_layers, m.remat = _LAYERS.value, scan, remat
  m = ml_collections.FrozenConfigDict(m)
  graphdef, params, rest = split_model(nnx.eval_shape(lambda: Decoder(m, rngs=nnx.Rngs(0))))
  tokens = jax.ShapeDtypeStruct((_BATCH.value, _SEQ.value + 1), "int32")

  def loss(params, rest, tokens):
    logits, aux, _ = nnx.merge(graphdef, params, rest)(
      tokens[:, :-1], train=True, rng=jax.random.key(0)
    )
    return cross_entropy(logits, tokens[:, 1:]) + aux["aux_loss"]

  start = time.perf_counter()
  compiled = jax.jit(jax.grad(loss)).lower(params, rest, tokens).compile()
  return time.perf_counter() - start, compiled


def main(argv):
  del argv
  rows = []
  for scan, remat in [(False, "none"), (True, "none")] + [
    (True, p) for p in REMAT_POLICIES if p != "none"
  ]:
    times = []
    for _ in range(_REPEATS.value):
      seconds, compiled = compiled_step(scan, remat)
      times.append(seconds)
    rows.append(
      (scan, remat, statistics.median(times), compiled.memory_analysis().temp_size_in_bytes)
    )
  print(
    f"{_LAYERS.value} layers, batch {_BATCH.value} x {_SEQ.value}, jax {jax.__version__}, "
    f"{jax.devices()[0].platform}"
  )
  print(table(rows))


def table(rows) -> str:
  """Markdown: rows of (scan, remat, compile seconds, temp bytes), the first the loop's
  and the second scan without remat (the ratios' denominators)."""
  loop_seconds, base_temp = rows[0][2], rows[1][3]
  return markdown_table(
    ["layers", "remat", "compile s", "vs loop", "temp MiB", "vs scan, no remat"],
    [
      [
        "scan" if scan else "loop",
        remat,
        f"{seconds:.1f}",
        f"{seconds / loop_seconds:.2f}",
        f"{temp / 2**20:.1f}",
        f"{temp / base_temp:.2f}",
      ]
      for scan, remat, seconds, temp in rows
    ],
  )


if __name__ == "__main__":
  app.run(main)
