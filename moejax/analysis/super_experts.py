"""Super experts, massive activations and attention sinks of a trained MoE LM.

Super Experts (Su et al. 2025, arXiv 2507.23279; the official profiler
ZunhaiSu/Super-Experts-Profilling, eval_utils.py, read in full):
    a_{l,e} = max over the calibration tokens routed to expert e of MoE layer l
              of |down_proj output| (every channel of the expert's output row),
    (l, e) is an SE  iff  l < round(0.75 num_layers)  and, over those layers' a only,
              a_{l,e} > P99.5  and  a_{l,e} > max // 10   (rule "official").
round is Python's (half to even: 6 layers keep 4) and // floor division, as the official
`round(total_layers * include_layers)` and `np.max(...) // times`; P99.5 is numpy's linear
percentile. The other rule, "massive_layers" (ours, a guess kept for comparison): the
thresholds over all layers' a, and only layers whose residual max/median is at least
`min_ratio` with a max grown `growth`-fold over the stream entering the block.
Massive activations (Sun et al. 2024): per block, the largest |h| of the residual
stream after the block, where it occurs and its ratio to the median |h|. Attention
sinks (Xiao et al. 2024): per layer, the attention probability on key position 0,
mean over heads and query positions > 0.

Everything comes from one forward pass, captured with nnx.capture
(models/capture.captured_forward: MoE inputs, block outputs and each attention's
`probabilities`) and the model's own routing (aux["moe"]): a_{l,e} runs each expert
only on the rows the router sent it (assignment/layout.tile_layout).
Differences from the official profiler: a is float32 (not bf16), shared experts are not
profiled, an expert no token reaches has a = 0, and "routed" is the router's valid slots.

The ablation of the paper's SEs is moejax/analysis/super_expert_ablation.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.models.structure import moe_layer_indices
from moejax.errors import ConfigError
from moejax.models.capture import captured_forward, routed_rows
from moejax.models.decoder import abstract_model, unstack_layers

PARTS = ("peaks", "massive", "sinks")  # measure also takes "counts" (the ablation study's)


def routed_output_peaks(layer, x_TxD, aux) -> jax.Array:
  """a_e of one MoE layer: max |expert e output| over the rows routed to e -> float32 [E].

  x_TxD: the layer's input; aux: its aux (expert_index, combine_weight, valid)."""
  num_experts = layer.cfg.num_experts
  routed = routed_rows(layer, x_TxD, aux)
  row_peak = jnp.max(jnp.abs(routed["rows"]), axis=-1)
  return (
    jnp.zeros(num_experts + 1, jnp.float32).at[routed["expert"]].max(row_peak)[:num_experts]
  )  # padding rows: expert E


def _stack_layers(rows) -> jax.Array:
  """Per-MoE-layer vectors [E_l] -> [layers, max E_l], NaN past a layer's own count."""
  width = max((r.shape[0] for r in rows), default=0)
  return (
    jnp.stack([jnp.pad(r, (0, width - r.shape[0]), constant_values=jnp.nan) for r in rows])
    if rows
    else jnp.zeros((0, 0), jnp.float32)
  )


def _residual_stats(h_BxLxD) -> dict:
  """max |h|, its (row, position, channel), the median |h| and max / median."""
  magnitude = jnp.abs(h_BxLxD.astype(jnp.float32))
  row, position, channel = jnp.unravel_index(jnp.argmax(magnitude), magnitude.shape)
  peak, median = jnp.max(magnitude), jnp.median(magnitude)
  return {
    "max": peak,
    "row": row,
    "position": position,
    "channel": channel,
    "median": median,
    "ratio": peak / jnp.maximum(median, 1e-30),
  }


def _measure(model, tokens, parts) -> dict:
  if model.cfg.scan_layers:
    raise ConfigError(
      "profiling reads the loop layout; convert a scanned model with "
      "moejax.models.decoder.unstack_layers"
    )
  _, aux, outputs = captured_forward(model, tokens)
  out: dict[str, jax.Array | dict[str, jax.Array]] = {}
  if "peaks" in parts:
    moe_blocks = [i for i, block in enumerate(model.blocks) if block.is_moe]
    rows = [
      routed_output_peaks(
        model.blocks[i].ffn,
        outputs[("blocks", i, "ffn_norm", "__call__")].reshape(-1, model.cfg.d_model),
        layer_aux,
      )
      for i, layer_aux in zip(moe_blocks, aux["moe"])
    ]
    out["peaks"] = _stack_layers(rows)
  if "counts" in parts:  # the model's own routing frequency: valid slots per expert
    sizes = [block.ffn.cfg.num_experts for block in model.blocks if block.is_moe]
    out["counts"] = _stack_layers(
      [
        jnp.zeros(n + 1, jnp.float32).at[jnp.where(a["valid"], a["expert_index"], n)].add(1.0)[:n]
        for n, a in zip(sizes, aux["moe"])
      ]
    )
  if "massive" in parts:
    layers = [
      _residual_stats(outputs[("blocks", i, "__call__")][0]) for i in range(len(model.blocks))
    ]
    massive = {key: jnp.stack([s[key] for s in layers]) for key in layers[0]}
    embedded = model.embed[...].astype(model.dtype)[tokens]
    massive["embedding_max"] = jnp.max(jnp.abs(embedded.astype(jnp.float32)))
    out["massive"] = massive
  if "sinks" in parts:
    probs = [outputs[("blocks", i, "attn", "probabilities")] for i in range(len(model.blocks))]
    out["sinks"] = jnp.stack([jnp.mean(p[..., 1:, 0]) for p in probs])  # [B, G, R, L, S]
  return out


@functools.partial(jax.jit, static_argnums=(0, 4))
def measure(graphdef, params, rest, tokens, parts: tuple = PARTS) -> dict:
  """The `parts` (of PARTS) of the model on tokens [B, L] (no padding), in one
  compiled program: {"peaks": expert_output_peaks, "massive": massive_activations,
  "sinks": attention_sink_mass, "counts": routed slots per (MoE layer, expert), float32,
  NaN past a layer's own count}. Parts not asked for are not computed (the three
  functions below share the program of all three: one compilation per model)."""
  return _measure(nnx.merge(graphdef, params, rest), tokens, parts)


def expert_output_peaks(graphdef, params, rest, tokens) -> jax.Array:
  """a_{l,e} -> float32 [num MoE layers, E] (NaN past a layer's own expert count
  when the layers differ)."""
  return measure(graphdef, params, rest, tokens)["peaks"]


def massive_activations(graphdef, params, rest, tokens) -> dict:
  """Per block [num_layers], the residual stream after it: max |h|, where it is
  (row, position, channel), median |h| and ratio = max / median; embedding_max:
  max |h| of the stream entering block 0. Read before an L3 lookup (if any)."""
  return measure(graphdef, params, rest, tokens)["massive"]


def attention_sink_mass(graphdef, params, rest, tokens) -> jax.Array:
  """Per layer, the attention probability on key position 0, mean over heads and
  query positions 1..L-1 (causal; position 0 sees only itself) -> float32 [layers]."""
  return measure(graphdef, params, rest, tokens)["sinks"]


def uniform_sink_mass(length: int) -> float:
  """What attention_sink_mass would be if every query attended uniformly over its
  causal keys: mean over q = 1..L-1 of 1 / (q + 1) (the no-sink baseline)."""
  return float(np.mean(1.0 / np.arange(2, length + 1))) if length > 1 else float("nan")


RULES = ("official", "massive_layers")


def super_experts(
  peaks, quantile: float = 99.5, fraction_of_max: float = 0.1, layers=None, *, within: bool = False
) -> list[tuple[int, int]]:
  """(layer, expert) with a > P_quantile(A) and a > fraction_of_max * max(A) of
  `peaks` [layers, E] (NaN ignored), in the rows `layers` (None: every row).
  within=False: A is all of peaks (the massive_layers rule); True: A is the rows
  `layers` only and the second threshold max(A) // (1 / fraction_of_max), floor
  division (the official rule; module doc)."""
  a = np.asarray(peaks, np.float64)
  allowed = sorted(range(a.shape[0]) if layers is None else {int(layer) for layer in layers})
  pool = a[allowed] if within else a
  if pool.size == 0 or np.all(np.isnan(pool)):
    return []
  top = np.nanmax(pool)
  threshold = max(
    np.nanpercentile(pool, quantile),
    top // (1 / fraction_of_max) if within else fraction_of_max * top,
  )
  found = np.argwhere(np.nan_to_num(a, nan=-np.inf) > threshold)
  return [(int(layer), int(expert)) for layer, expert in found if layer in allowed]


def official_layers(moe_blocks, num_layers: int, include_layers: float = 0.75) -> list[int]:
  """The MoE layers (rows) the official rule profiles: those of blocks before
  round(num_layers * include_layers) (Python's round, as the official run.py)."""
  keep = round(num_layers * include_layers)
  return [j for j, block in enumerate(moe_blocks) if block < keep]


def select(
  rule: str,
  peaks,
  massive: dict,
  moe_blocks,
  num_layers: int,
  *,
  quantile: float = 99.5,
  fraction_of_max: float = 0.1,
  include_layers: float = 0.75,
  min_ratio: float = 100.0,
  growth: float = 2.0,
) -> list[tuple[int, int]]:
  """The SEs (MoE layer, expert) of `peaks` by `rule` (RULES; module doc)."""
  if rule == "official":
    return super_experts(
      peaks,
      quantile,
      fraction_of_max,
      official_layers(moe_blocks, num_layers, include_layers),
      within=True,
    )
  if rule == "massive_layers":
    formed = massive_layers(massive, min_ratio, growth)
    rows = [j for j, block in enumerate(moe_blocks) if block in formed]
    return super_experts(peaks, quantile, fraction_of_max, rows)
  raise ConfigError(f"rule={rule!r} must be one of {', '.join(RULES)}")


def massive_layers(massive: dict, min_ratio: float = 100.0, growth: float = 2.0) -> list[int]:
  """Blocks where massive activations form (the paper's L, a guess): the residual
  max / median after the block is at least min_ratio and its max is at least
  `growth` times the max of the stream entering the block."""
  peak = np.asarray(massive["max"], np.float64)
  before = np.concatenate([[float(massive["embedding_max"])], peak[:-1]])
  ratio = np.asarray(massive["ratio"], np.float64)
  return [int(i) for i in np.flatnonzero((ratio >= min_ratio) & (peak >= growth * before))]


def model_of(source):
  """(model config, graphdef, params, rest) in the loop layout, from a workdir or
  (config or model config, params, rest)."""
  if isinstance(source, str):
    from moejax.train.load import load_model

    loaded, _, _ = load_model(source)
    m, params, rest = loaded.config, loaded.params, loaded.rest
  else:
    config, params, rest = source
    m = config.model if "model" in config else config
    m, params, rest = unstack_layers(m, params, rest)
  return (m, abstract_model(m)[0], params, rest)


def profile(source, tokens, **criterion) -> dict:
  """All three for a model (a workdir, or (config, params, rest)) on tokens [B, L]
  (no padding), JSON-ready; criterion: profile_report's."""
  m, graphdef, params, rest = model_of(source)
  tokens = jnp.asarray(tokens, jnp.int32)
  found = jax.device_get(measure(graphdef, params, rest, tokens, PARTS))
  return profile_report(m, tokens.shape, found, **criterion)


def profile_report(
  m,
  shape,
  found,
  *,
  rule: str = "official",
  quantile: float = 99.5,
  fraction_of_max: float = 0.1,
  include_layers: float = 0.75,
  min_ratio: float = 100.0,
  growth: float = 2.0,
) -> dict:
  """profile's JSON from measure's PARTS (found, on the host) for tokens of `shape`:
  super_experts by `rule`, super_experts_by_rule by each of RULES, and
  super_experts_unfiltered by the two thresholds over every layer alone."""
  moe_blocks = moe_layer_indices(m)
  massive = {k: np.asarray(v) for k, v in found["massive"].items()}
  formed = massive_layers(massive, min_ratio, growth)
  peaks = np.asarray(found["peaks"], np.float64)
  criterion = {
    "quantile": quantile,
    "fraction_of_max": fraction_of_max,
    "include_layers": include_layers,
    "min_ratio": min_ratio,
    "growth": growth,
  }
  by_rule = {
    name: select(name, peaks, massive, moe_blocks, m.num_layers, **criterion) for name in RULES
  }
  if rule not in by_rule:
    raise ConfigError(f"rule={rule!r} must be one of {', '.join(RULES)}")

  def pairs(chosen):
    return [
      {"moe_layer": j, "block": moe_blocks[j], "expert": e, "a": float(peaks[j, e])}
      for j, e in chosen
    ]

  return {
    "tokens": list(shape),
    "moe_blocks": moe_blocks,
    "expert_output_peaks": [[None if np.isnan(v) else float(v) for v in row] for row in peaks],
    "super_experts": pairs(by_rule[rule]),
    "super_experts_by_rule": {name: pairs(found) for name, found in by_rule.items()},
    "super_experts_unfiltered": pairs(super_experts(peaks, quantile, fraction_of_max)),
    "criterion": {"rule": rule, **criterion},
    "massive_activations": {
      "layers": [
        {
          key: (
            float(massive[key][i]) if key in ("max", "median", "ratio") else int(massive[key][i])
          )
          for key in ("max", "row", "position", "channel", "median", "ratio")
        }
        for i in range(len(massive["max"]))
      ],
      "embedding_max": float(massive["embedding_max"]),
      "massive_layers": formed,
    },
    "attention_sinks": {
      "mass_on_position_0": [float(v) for v in found["sinks"]],
      "uniform_baseline": uniform_sink_mass(int(shape[1])),
    },
  }
