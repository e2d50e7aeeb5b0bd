"""What a post-training study measures of a pruned or compressed model, against the
source it came from (`Bench`): held-out bits per byte (overall and per domain,
moejax/evaluation/harness.py on the first `bytes_per_domain` bytes of every domain,
the same bytes for every model), probe accuracies, parameter counts and stored
bytes, and
the fraction of (token, MoE layer) pairs whose top-k expert set differs from the
source's on held-out windows (`rerouted`).

Calibration draw d: `num_windows` windows of the training seq_len drawn with seed d
from the training split (calibration.calibration_windows), shared by every method
scored on that draw.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.models.capture import captured_forward
from moejax.posttrain import source as source_lib
from moejax.posttrain.calibration import Calibration, calibration_windows

REROUTE_SEED = 12345  # the held-out windows of the re-routing measure
BATCH = 8


def domains_of(data) -> tuple[str, ...]:
  """The domains the harness reports for the data config `data` (bpb.bpb_by_domain):
  mix's domains, else the one named after the data."""
  if data.name == "mix":
    from moejax.data.mix import DOMAINS

    return tuple(sorted(DOMAINS))
  return (data.name,)


def probes_of(setting: str, data) -> tuple[str, ...]:
  """A probes setting as names: 'auto' (every probe for a mix model, else none), ''
  (none) or comma-separated names."""
  from moejax.evaluation.probe_data import PROBES

  if setting == "auto":
    return tuple(PROBES) if data.name == "mix" else ()
  return tuple(p for p in setting.split(",") if p)


def metric_names(domains, probes) -> tuple[str, ...]:
  """bpb (all), bpb/<domain>, probe/<name>: what `Bench.evaluate` returns."""
  return ("bpb", *(f"bpb/{d}" for d in domains), *(f"probe/{p}" for p in probes))


def parameter_bytes(*trees) -> int:
  """Bytes of the arrays of `trees` as a checkpoint holds them (a compressed expert
  type's codes one per uint8). Deterministic, unlike the bytes on disk, which
  OCDBT lays out differently on every save of the same arrays."""
  return int(sum(np.asarray(leaf).nbytes for tree in trees for leaf in jax.tree.leaves(tree)))


def expert_parameters(params) -> int:
  """Routed-expert parameters that can contribute: w_gate, w_up and w_down entries
  of every atom (hidden unit) whose w_down row is not all zero (an atom method's
  removed atoms are zero padding, posttrain/atoms.py)."""
  total = 0
  for block in params["blocks"].values():
    experts = block.get("ffn", {}).get("experts") if isinstance(block, dict) else None
    if not experts or "w_down" not in experts:
      continue
    w_down = np.asarray(experts["w_down"])  # [E, F, d]
    live = np.any(w_down != 0, axis=-1)
    total += int(live.sum()) * (2 * np.asarray(experts["w_gate"]).shape[1] + w_down.shape[2])
  return total


@functools.partial(jax.jit, static_argnums=0)
def _top_k_sets(graphdef, params, rest, tokens):
  model = nnx.merge(graphdef, params, rest)
  _, aux, _ = captured_forward(model, tokens)
  e = model.cfg.moe.num_experts
  out = []
  for layer in aux["moe"]:
    index = layer["expert_index"].reshape(-1, layer["expert_index"].shape[-1])
    valid = layer["valid"].reshape(index.shape)
    out.append(
      jnp.zeros((index.shape[0], e + 1), bool)
      .at[jnp.arange(index.shape[0])[:, None], jnp.where(valid, index, e)]
      .set(True)[:, :e]
    )
  return jnp.stack(out, axis=1)


def routing_sets(graphdef, params, rest, batches) -> np.ndarray:
  """bool [tokens, MoE layers, E]: each token's top-k expert set in every MoE layer
  (one compiled program per model config, whatever the parameters)."""
  return np.concatenate(
    [np.asarray(_top_k_sets(graphdef, params, rest, jnp.asarray(b))) for b in batches]
  )


def rerouted(reference_sets: np.ndarray, sets: np.ndarray) -> float:
  """Fraction of (token, MoE layer) pairs whose top-k expert set changed."""
  return float(np.mean(np.any(reference_sets != sets, axis=-1)))


class Bench:
  """A training workdir's model, read once, and everything its studies score with:
  held-out documents and probes, calibration draws, re-routing windows."""

  def __init__(
    self,
    workdir: str,
    *,
    num_windows: int,
    bytes_per_domain: int,
    probes,
    probe_count: int,
    reroute_windows: int = 0,
    key: str = "--workdir",
  ):
    self.workdir, self.key = workdir, key
    self.num_windows, self.bytes_per_domain = num_windows, bytes_per_domain
    self.probes, self.probe_count = tuple(probes), probe_count
    self.reroute_windows = reroute_windows
    self._calibration: tuple[int, Calibration] | None = None

  @functools.cached_property
  def source(self) -> source_lib.Source:
    return source_lib.load_training(self.workdir, self.key)

  @property
  def model(self):
    return self.source.model

  @property
  def run_config(self):
    """The training run's config."""
    return self.source.training_run()[0]

  @functools.cached_property
  def graphdef(self):
    from moejax.models.decoder import abstract_model

    return abstract_model(self.model)[0]

  @functools.cached_property
  def documents(self) -> list:
    from moejax.data.pipeline import split_documents
    from moejax.evaluation import harness

    return harness.sample_documents(split_documents(self.run_config.data), self.bytes_per_domain)

  @functools.cached_property
  def train_stream(self) -> np.ndarray:
    from moejax.data.pipeline import train_token_stream

    return train_token_stream(self.run_config.data)

  def calibration(self, draw: int) -> Calibration:
    """Draw `draw`'s calibration (the latest draw's is kept)."""
    if self._calibration is None or self._calibration[0] != draw:
      windows = calibration_windows(
        self.train_stream, self.num_windows, self.run_config.data.seq_len, seed=draw
      )
      self._calibration = (
        draw,
        Calibration(self.model, self.source.params, self.source.rest, windows),
      )
    return self._calibration[1]

  def evaluate(self, m, params: dict, rest: dict) -> dict[str, float]:
    """{bpb, bpb/<domain>, probe/<name>} of the model (m, params, rest)."""
    from moejax.models.structure import expert_counts
    from moejax.evaluation import harness
    from moejax.evaluation.model import DecoderLM

    settings = harness.Settings(
      context=self.run_config.data.seq_len, probes=self.probes, probe_count=self.probe_count
    )
    tokenizer = self.source.tokenizer
    report = harness.evaluate(
      DecoderLM(m, params, rest),
      tokenizer,
      tokenizer.eos_id,
      self.documents,
      settings,
      expert_counts(m),
    ).report
    out = {("bpb" if d == "all" else f"bpb/{d}"): v for d, v in report["bpb"].items()}
    for name, groups in report["probes"].items():
      accuracy = groups["all"]["accuracy"]
      out[f"probe/{name}"] = float("nan") if accuracy is None else accuracy
    return out

  @functools.cached_property
  def held_out(self) -> list:
    """Batches of `reroute_windows` windows of the held-out documents' tokens."""
    from moejax.data.pipeline import split_documents

    tokenizer = self.source.tokenizer
    ids = []
    for _, text in split_documents(self.run_config.data):
      ids.extend(tokenizer.encode(text))
    windows = calibration_windows(
      np.asarray(ids, np.int32),
      self.reroute_windows,
      self.run_config.data.seq_len,
      seed=REROUTE_SEED,
    )
    return [windows[i : i + BATCH] for i in range(0, len(windows), BATCH)]

  def routing_sets(self, params: dict, m=None, rest: dict | None = None) -> np.ndarray:
    """Top-k sets on the held-out windows of the source model with `params` (or of
    the model config `m` with params and rest)."""
    if m is None:
      return routing_sets(self.graphdef, params, self.source.rest, self.held_out)
    from moejax.models.decoder import abstract_model

    return routing_sets(abstract_model(m)[0], params, rest, self.held_out)

  @functools.cached_property
  def source_sets(self) -> np.ndarray:
    return self.routing_sets(self.source.params)
