"""Super-expert ablation (Su et al. 2025, arXiv 2507.23279, the paper's pruning of SEs),
over the profile of moejax/analysis/super_experts.py.

ablate_experts zeroes an expert's down
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

from moejax.analysis.super_experts import PARTS, measure, model_of, profile_report
from moejax.errors import ConfigError
from moejax.models.structure import moe_layer_indices


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
