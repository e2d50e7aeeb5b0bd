"""Inference-time routers on a trained model: swap the router, keep the weights.

Capacity-aware drop (arXiv 2503.05066), As-COOT (TiME) and SERE (arXiv
2602.07616) change only how a trained model's router assigns tokens at
inference. The helpers here rebuild a trained model with other
`model.moe` router keys and the same parameters (`with_router`), score it on
batches (`score_batches`), calibrate SERE's expert-similarity matrices from
calibration tokens (`calibrate_similarity`) and write them into a router's
state (`set_router_state`), and score teacher-forced KV-cache decoding, where
each step's MoE call sees one token per sequence (`decode_score`). `TrainedMoE`
loads a trained MoE LM with its data and cuts the held-out inputs the three studies
score (moejax/studies/scorers/router_inference.py): validation batches, decode windows
and batches of one held-out play at a time.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.analysis.expert_similarity import linear_cka_matrix
from moejax.errors import ConfigError
from moejax.experts import swiglu_experts
from moejax.inference.generate import decode_programs
from moejax.inference.kv_cache import init_cache
from moejax.models.capture import expert_outputs_on_tokens, moe_layer_inputs
from moejax.models.decoder import abstract_model
from moejax.train.build import build_model
from moejax.train.step import cross_entropy, moe_metrics, split_model


def with_router(config, **moe_keys):
  """(config', graphdef') of the same model with `model.moe` keys replaced; the
  trained (params, rest) merge into it when the router state has the same shape."""
  config = config.copy_and_resolve_references()
  config.model.moe.update(moe_keys)
  graphdef, _, _ = split_model(nnx.eval_shape(lambda: build_model(config)))
  return config, graphdef


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, params, rest, inputs, targets):
  logits, aux, _ = nnx.merge(graphdef, params, rest)(inputs)
  return cross_entropy(logits, targets), moe_metrics(aux)


def score_batches(graphdef, params, rest, batches, top_k: int) -> dict:
  """val bpb (byte tokens) and MoE figures averaged over layers and batches:
  max/mean load, max load (assignments to the busiest expert per call),
  experts per token (kept assignments / tokens) and kept fraction (/ top_k)."""
  losses, figures = [], []
  for batch in batches:
    loss, layers = _forward(graphdef, params, rest, batch["inputs"], batch["targets"])
    losses.append(float(loss))
    tokens = batch["inputs"].size
    for m in jax.device_get(layers):
      num_experts = m["load_fraction"].shape[0]
      per_token = float(m["experts_per_token"])
      figures.append(
        {
          "max_over_mean_load": float(m["max_over_mean_load"]),
          "max_load": float(m["max_over_mean_load"]) * per_token * tokens / num_experts,
          "experts_per_token": per_token,
          "kept_fraction": per_token / top_k,
        }
      )
  out = {key: float(np.mean([f[key] for f in figures])) for key in figures[0]}
  return {"bpb": float(np.mean(losses)) / math.log(2), **out}


@functools.partial(jax.jit, static_argnums=0)
def calibrate_similarity(graphdef, params, rest, tokens) -> jax.Array:
  """SERE's offline step: linear CKA between every pair of experts' outputs on
  the calibration tokens' MoE inputs, per MoE layer -> float32 [layers, E, E].
  One compiled program (eagerly, every expert's op dispatches on its own)."""
  model = nnx.merge(graphdef, params, rest)
  inputs = moe_layer_inputs(model, tokens)
  layers = [b.ffn for b in model.blocks if b.is_moe]
  return jnp.stack(
    [
      linear_cka_matrix(
        expert_outputs_on_tokens(
          functools.partial(swiglu_experts, layer.experts.weights(jnp.float32)),
          x,
          layer.cfg.num_experts,
        )
      )
      for layer, x in zip(layers, inputs)
    ]
  )


def set_router_state(rest: dict, name: str, per_layer) -> dict:
  """A copy of `rest` with router state `name` of the i-th MoE layer (in layer
  order) set to per_layer[i]; the count must match."""
  found = []

  def visit(tree, path):
    for key, value in tree.items():
      if isinstance(value, dict):
        visit(value, path + (key,))
      elif key == name:
        found.append(path + (key,))

  visit(rest, ())
  if len(found) != len(per_layer):
    raise ConfigError(
      f"{len(found)} router states named {name!r} (one per MoE layer), "
      f"but {len(per_layer)} values were given"
    )
  out = jax.tree.map(lambda x: x, rest)

  def layer_order(path):
    return [(0, k, "") if isinstance(k, int) else (1, 0, str(k)) for k in path]

  for path, value in zip(sorted(found, key=layer_order), per_layer):
    node = out
    for key in path[:-1]:
      node = node[key]
    if np.shape(value) != np.shape(node[path[-1]]):
      raise ConfigError(
        f"router state {name!r} at {'/'.join(map(str, path[:-1]))} has shape "
        f"{np.shape(node[path[-1]])}; the value given has {np.shape(value)}"
      )
    node[path[-1]] = jnp.asarray(value, node[path[-1]].dtype)
  return out


def with_sere(m, rest: dict, similarity, rho: float, primary_slots: int = 1):
  """(model config, rest) of a model `m` switched to SERE routing
  with calibrated similarity [moe layers, E, E]; rest keeps every other state."""
  m = m.copy_and_resolve_references()
  m.moe.router = "sere"
  m.moe.sere.update(rho=rho, primary_slots=primary_slots)
  _, _, abstract_rest = abstract_model(m)

  def fill(abstract, values):
    return {
      key: fill(value, values.get(key, {}))
      if isinstance(value, dict)
      else values.get(key, np.zeros(value.shape, value.dtype))
      for key, value in abstract.items()
    }

  return m, set_router_state(fill(abstract_rest, rest), "expert_similarity", list(similarity))


def decode_score(m, params, rest, windows: np.ndarray, batch: int) -> dict:
  """Teacher-forced KV-cache decoding of `windows` [N, L+1] in batches of `batch`
  rows (a remainder of fewer rows is left out): every step feeds one true token
  per row, so each MoE call routes exactly `batch` tokens (a decode batch).
  Returns bpb over all predicted tokens and the distinct experts a step
  activates (mean over steps and MoE layers)."""
  step = decode_programs(m, generation=False).forward
  ones = np.ones((batch, 1), bool)
  nll, count, distinct = 0.0, 0, []
  for start in range(0, len(windows) - batch + 1, batch):
    rows = windows[start : start + batch]
    cache = init_cache(m, batch, rows.shape[1] - 1)
    for t in range(rows.shape[1] - 1):
      logits, step_distinct, cache = step(params, rest, rows[:, t : t + 1], ones, cache)
      logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
      nll -= float(jnp.sum(jnp.take_along_axis(logp, rows[:, t + 1, None], axis=-1)))
      count += batch
      distinct.append(np.asarray(step_distinct))
  return {"bpb": nll / count / math.log(2), "distinct_experts": float(np.mean(distinct))}


class TrainedMoE:
  """A trained byte-level MoE LM from a training workdir, with its data pipeline:
  config, graphdef, params, rest, tokenizer, data (build_lm_data at the run's seed).
  ConfigError naming `key` for a model that is not an MoE or a non-byte tokenizer
  (bpb here is loss / ln 2 per token)."""

  def __init__(self, workdir: str, key: str = "workdir"):
    from moejax.data.pipeline import build_lm_data
    from moejax.train.restore import load_from_workdir

    self.workdir = workdir
    (self.config, self.graphdef, self.params, self.rest, self.tokenizer) = load_from_workdir(
      workdir
    )
    if self.config.model.ffn_type != "moe":
      raise ConfigError(
        f"model.ffn_type={self.config.model.ffn_type!r}: these studies need "
        f"an MoE model ({key}={workdir!r})"
      )
    self.data = build_lm_data(self.config.data, seed=self.config.seed)
    if self.data.bytes_per_token != 1.0:
      raise ConfigError(
        f"data.tokenizer={self.config.data.tokenizer!r}: bpb here assumes the "
        f"byte tokenizer ({key}={workdir!r})"
      )
    self._eval: list[dict] | None = None

  def eval_batches(self) -> list[dict]:
    """Every validation batch, in order."""
    if self._eval is None:
      self._eval = list(self.data.eval_batches(None))
    return self._eval

  def decode_windows(self, start: int, count: int, length: int) -> np.ndarray:
    """Validation windows start..start+count-1, their first length + 1 tokens [count, L+1]."""
    windows = np.concatenate(
      [np.concatenate([b["inputs"], b["targets"][:, -1:]], 1) for b in self.eval_batches()]
    )
    if start + count > len(windows) or length + 1 > windows.shape[1]:
      raise ConfigError(
        f"the validation split has {len(windows)} windows of "
        f"{windows.shape[1] - 1} tokens; asked for windows {start}.."
        f"{start + count - 1} of {length} tokens"
      )
    return windows[start : start + count, : length + 1]

  def calibration_tokens(self, num_batches: int) -> np.ndarray:
    """The first num_batches training batches' inputs (the run's own data order)."""
    from moejax.data.pipeline import build_lm_data

    train = build_lm_data(self.config.data, seed=self.config.seed).train_iter
    return np.concatenate([next(train)["inputs"] for _ in range(num_batches)])

  def play_batches(self, num_batches: int) -> list[tuple[str, list[dict]]]:
    """[(play, batches)] of consecutive windows from one held-out play each (a shifted
    batch: every token of a call from the same text), plays in validation order."""
    from moejax.data.shakespeare import shakespeare_sources

    if not self.config.data.name.startswith("shakespeare"):
      raise ConfigError(
        f"data.name={self.config.data.name!r}: play batches need the "
        f"Shakespeare plays ({self.workdir})"
      )
    b, length = self.config.data.batch_size, self.config.data.seq_len
    out = []
    for example in shakespeare_sources(self.config.data.data_dir)["validation"]:
      tokens = np.asarray(self.tokenizer.encode(example["text"].decode()), np.int32)
      windows = tokens[: num_batches * b * (length + 1)].reshape(num_batches, b, length + 1)
      out.append(
        (example["title"].decode(), [{"inputs": w[:, :-1], "targets": w[:, 1:]} for w in windows])
      )
    return out
