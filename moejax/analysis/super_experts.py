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

Ablation (the paper's pruning of SEs): ablate_experts zeroes an expert's down
projection, the router untouched; ablation_study compares the SEs with as many random
and as many most-frequently routed experts (valid slots over all MoE layers, one
ranking, ties to the lower (layer, expert)), by attention mass on position 0, residual
max |h| and loss. When the rule names no SE the study ablates the experts of largest a
(`top_a`).
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


# ---- ablation (arXiv 2507.23279) -------------------------------------------------------------


def ablate_experts(m, params, pairs) -> dict:
  """A copy of params (loop layout) in which each (MoE layer, expert) of `pairs`
  outputs exactly 0: its SwiGLU down projection is zeroed. The router is untouched,
  so tokens still go to the expert and receive 0 from it (the paper's ablation).
  ConfigError, naming the pair, for a pair outside the model or an expert type
  without a w_down."""
  if m.scan_layers:
    raise ConfigError(
      "ablation edits the loop layout; convert a scanned model with "
      "moejax.models.decoder.unstack_layers"
    )
  moe_blocks = moe_layer_indices(m)
  out = jax.tree.map(lambda v: v, params)
  for layer, expert in pairs:
    where = f"(pair=({layer}, {expert}))"
    if not 0 <= layer < len(moe_blocks):
      raise ConfigError(
        f"MoE layer {layer} is not in the model, which has {len(moe_blocks)} MoE layers {where}"
      )
    weights = out["blocks"][moe_blocks[layer]]["ffn"]["experts"]
    kind = m.moe.get("experts", "swiglu")
    if kind != "swiglu" or "w_down" not in weights:
      raise ConfigError(
        f"cannot ablate model.moe.experts={kind!r}: ablation zeroes "
        f"a SwiGLU expert's w_down {where}"
      )
    count = weights["w_down"].shape[0]
    if not 0 <= expert < count:
      raise ConfigError(
        f"expert {expert} is not in MoE layer {layer}, which has {count} experts {where}"
      )
    weights["w_down"] = weights["w_down"].at[expert].set(0.0)
  return out


def top_pairs(values, n: int) -> list[tuple[int, int]]:
  """The n (MoE layer, expert) of largest value in values [layers, E] over all layers
  together (NaN padding never chosen; ties to the lower (layer, expert)), sorted."""
  v = np.asarray(values, np.float64)
  _check_count(v, n)
  order = np.argsort(-np.nan_to_num(v, nan=-np.inf).ravel(), kind="stable")[:n]
  return sorted((int(i) // v.shape[1], int(i) % v.shape[1]) for i in order)


def random_pairs(values, n: int, seed: int) -> list[tuple[int, int]]:
  """n distinct (MoE layer, expert), uniform over the non-NaN entries of values
  [layers, E] (numpy default_rng(seed), without replacement), sorted."""
  v = np.asarray(values, np.float64)
  _check_count(v, n)
  entries = np.argwhere(~np.isnan(v))
  pick = np.random.default_rng(seed).choice(len(entries), n, replace=False)
  return sorted((int(entries[i, 0]), int(entries[i, 1])) for i in pick)


def _check_count(values, n: int) -> None:
  available = int(np.sum(~np.isnan(values)))
  if not 1 <= n <= available:
    raise ConfigError(f"n={n}: ablate between 1 and the model's {available} experts")


@functools.partial(jax.jit, static_argnums=0)
def _row_nats(graphdef, params, rest, tokens):
  """Per row of tokens [B, L]: the sum of -log p(token t+1 | tokens <= t), float32."""
  logits, _, _ = nnx.merge(graphdef, params, rest)(tokens[:, :-1])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0], axis=-1)


def next_token_loss(graphdef, params, rest, tokens, batch_rows: int = 32) -> float:
  """Mean -log p (nats) of every token after the first of each row of tokens [B, L],
  in batches of batch_rows rows (the last one padded with row 0: one compilation)."""
  tokens = np.asarray(tokens, np.int32)
  total = 0.0
  for start in range(0, len(tokens), batch_rows):
    chunk = tokens[start : start + batch_rows]
    padded = np.concatenate([chunk, np.repeat(tokens[:1], batch_rows - len(chunk), 0)])
    nats = np.asarray(_row_nats(graphdef, params, rest, jnp.asarray(padded)), np.float64)
    total += float(np.sum(nats[: len(chunk)]))
  return total / (tokens.shape[0] * (tokens.shape[1] - 1))


def ablation_arms(report: dict, peaks, counts, n: int | None, seeds=()):
  """(n, [(arm, pairs)]) of ablation_study: `none`; `super_experts` (report's), or
  `top_a` (the n largest a) when the rule names none; `most_frequent` (top_pairs of
  the routing counts); `random_seed{s}` per seed. n: None = the number of SEs, 1 when none."""
  chosen = [(p["moe_layer"], p["expert"]) for p in report["super_experts"]]
  n = n if n is not None else max(len(chosen), 1)
  _check_count(np.asarray(peaks, np.float64), n)
  return n, [
    ("none", []),
    ("super_experts", chosen) if chosen else ("top_a", top_pairs(peaks, n)),
    ("most_frequent", top_pairs(counts, n)),
    *[(f"random_seed{s}", random_pairs(peaks, n, s)) for s in seeds],
  ]


def ablation_effect(
  m, graphdef, params, rest, tokens, found: dict, pairs, *, score=None, batch_rows: int = 32
) -> dict:
  """One arm of ablation_study: `pairs` ablated (found: measure's PARTS + counts of the
  unablated model on tokens, on the host), JSON-ready."""
  peaks, counts = np.asarray(found["peaks"]), np.asarray(found["counts"])
  moe_blocks = moe_layer_indices(m)
  ablated = ablate_experts(m, params, pairs)
  effect = (
    found
    if not pairs
    else jax.device_get(measure(graphdef, ablated, rest, tokens, ("massive", "sinks")))
  )
  sinks = [float(v) for v in effect["sinks"]]
  return {
    "experts": [
      {
        "moe_layer": j,
        "block": moe_blocks[j],
        "expert": e,
        "a": float(peaks[j, e]),
        "routed_slots": int(counts[j, e]),
      }
      for j, e in pairs
    ],
    "mass_on_position_0": sinks,
    "mean_mass_on_position_0": float(np.mean(sinks)),
    "residual_max": [float(v) for v in effect["massive"]["max"]],
    "residual_ratio": [float(v) for v in effect["massive"]["ratio"]],
    "max_residual": float(np.max(effect["massive"]["max"])),
    "loss_nats": next_token_loss(graphdef, ablated, rest, tokens, batch_rows),
    **(score(m, ablated, rest) if score else {}),
  }


def ablation_study(
  source,
  tokens,
  *,
  n: int | None = None,
  seeds=(0, 1, 2),
  score=None,
  batch_rows: int = 32,
  criterion: dict | None = None,
) -> dict:
  """Ablate the super experts (criterion: profile's thresholds) against as many
  random (one arm per seed) and as many most-frequently routed experts, on tokens
  [B, L] (no padding), JSON-ready.

  Arms (ablation_arms): `none` (the model as it is); `super_experts`, or `top_a` (the
  n largest a_{l,e}, no layer filter) when no expert passes the criterion;
  `most_frequent` (top_pairs of the routing counts on the same tokens);
  `random_seed{s}`. n: the size of every arm but the SE one (default: the number of
  SEs, 1 when none). Per arm (ablation_effect): the experts, the attention mass on
  position 0 per layer and its mean, the residual max |h| and max / median per block,
  the mean next-token loss in nats, and whatever score(m, params, rest) returns (e.g. bpb)."""
  m, graphdef, params, rest = model_of(source)
  tokens = jnp.asarray(tokens, jnp.int32)
  if len(set(seeds)) != len(seeds):
    raise ConfigError(f"seeds={list(seeds)}: a seed is given twice")
  found = jax.device_get(measure(graphdef, params, rest, tokens, PARTS + ("counts",)))
  report = profile_report(m, tokens.shape, found, **(criterion or {}))
  n, arms = ablation_arms(report, found["peaks"], found["counts"], n, seeds)
  out = [
    {
      "arm": name,
      **ablation_effect(
        m, graphdef, params, rest, tokens, found, pairs, score=score, batch_rows=batch_rows
      ),
    }
    for name, pairs in arms
  ]
  counts = np.asarray(found["counts"])
  return {
    "n": n,
    "seeds": list(seeds),
    "profile": report,
    "routed_slots": [[None if np.isnan(v) else int(v) for v in row] for row in counts],
    "arms": out,
  }
