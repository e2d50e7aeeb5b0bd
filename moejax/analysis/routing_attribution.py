"""Where a router's logits come from: an exact decomposition over the residual
stream (routing interpretability, ICLR 2026 list; the paper's text was not read,
the method follows /work/shared/specs/PAPERS.md).

The stream entering MoE block l's FFN is a sum of what wrote to it,
    x_l = embed + sum_{j<l} (attn_j + ffn_j) + attn_l,
attn_j = sum_h ctx_{j,h} W_o[h] (+ the output bias) per head h, and an earlier
MoE layer's output is sum_e g_{t,e} E_e(x_t) per expert e (+ its shared expert).
The router sees RMSNorm(x_l) = x_l * r_t * scale with r_t = rsqrt(mean(x_l^2) + eps);
freezing r_t at its forward-pass value makes the logits linear in x_l, so
    logits_l = sum_c (c * r_t * scale) @ W_router
exactly, c over every component above. Influence of a component on layer l:
the variance over tokens of its logit contribution, summed over experts.

Scope: the loop layout with the standard attention (GQA with RoPE; no q/k/v
clipping) and routers that read x @ W (router_kernel); no L3 lookup layers.
Guesses: the variance-over-tokens influence and the per-head split of W_o.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.layers.attention import GroupedQueryAttention, attend
from moejax.models.capture import captured_forward
from moejax.posttrain.contributions import routed_contributions


def check_supported(model) -> None:
  if model.cfg.scan_layers:
    raise ConfigError("routing attribution reads the loop layout: unstack_layers first")
  for i, block in enumerate(model.blocks):
    if block.lookup is not None:
      raise ConfigError(f"block {i}: routing attribution does not cover L3 lookup layers")
    if not isinstance(block.attn, GroupedQueryAttention) or block.attn.clip:
      raise ConfigError(
        f"block {i}: routing attribution needs the standard attention without q/k/v clipping"
      )
    if block.is_moe and block.ffn.router_kernel is None:
      raise ConfigError(f"block {i}: the router owns its projection; attribution needs x @ W")


def _head_outputs(block, outputs, i, b, length) -> jax.Array:
  """[H, T, d]: each head's share of block i's attention output (bias excluded)."""
  attn = block.attn
  probs = outputs[("blocks", i, "attn", "probabilities")]
  v = outputs[("blocks", i, "attn", "v", "__call__")].reshape(b, length, attn.num_kv_heads, -1)
  ctx = attend(probs, v).astype(jnp.float32)  # [B, L, H, V]
  heads, v_dim = ctx.shape[2], ctx.shape[3]
  w_o = attn.o.kernel[...].astype(jnp.float32).reshape(heads, v_dim, -1)
  return jnp.einsum("blhv,hvd->hbld", ctx, w_o).reshape(heads, b * length, -1)


def _components(model, tokens):
  """([C, T, d] float32 components of the stream in stream order (the order of
  component_names), {MoE block: (components it reads, its router input)})."""
  _, aux, outputs = captured_forward(model, tokens)
  b, length = tokens.shape
  d = model.cfg.d_model
  parts = [model.embed[...].astype(jnp.float32)[tokens].reshape(b * length, d)]
  readers = {}
  moe_aux = iter(aux["moe"])
  for i, block in enumerate(model.blocks):
    parts += list(_head_outputs(block, outputs, i, b, length))
    if block.attn.o.bias is not None:
      parts.append(jnp.broadcast_to(block.attn.o.bias[...].astype(jnp.float32), (b * length, d)))
    x_ffn = outputs[("blocks", i, "ffn_norm", "__call__")].reshape(b * length, d)
    if not block.is_moe:
      parts.append(
        outputs[("blocks", i, "ffn", "__call__")].reshape(b * length, d).astype(jnp.float32)
      )
      continue
    readers[i] = (len(parts), x_ffn)  # the router reads everything so far
    layer = block.ffn
    parts += list(jnp.moveaxis(routed_contributions(layer, x_ffn, next(moe_aux)), 1, 0))
    if layer.shared is not None:
      shared = layer.shared(x_ffn).astype(jnp.float32)
      if layer.shared_gate is not None:
        shared = shared * jax.nn.sigmoid(
          x_ffn.astype(jnp.float32) @ layer.shared_gate[...].astype(jnp.float32)
        )
      parts.append(shared)
  return jnp.stack(parts), readers


@functools.partial(jax.jit, static_argnums=0)
def _attribute(graphdef, params, rest, tokens):
  model = nnx.merge(graphdef, params, rest)
  parts, readers = _components(model, tokens)
  out = []
  for i, (count, router_input) in readers.items():
    block = model.blocks[i]
    stream = parts[:count]  # [C, T, d]
    x = jnp.sum(stream, axis=0)
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + block.ffn_norm.eps)  # frozen
    w = block.ffn.router_kernel[...].astype(jnp.float32)
    out.append(
      {
        "contributions": jnp.einsum("ctd,d,de->cte", stream * r, block.ffn_norm.scale[...], w),
        "logits": block.ffn.router_logits(router_input.astype(jnp.float32)),
      }
    )
  return out


def attribute(graphdef, params, rest, tokens) -> list[dict]:
  """Per MoE block (in order): block index, component names, contributions
  [C, T, E] (float32), the router's own logits [T, E] and the influence
  Var_t summed over experts [C] (module doc)."""
  model = nnx.merge(graphdef, params, rest)
  check_supported(model)
  names = component_names(model)
  out = []
  for block, layer in zip(
    [i for i, b in enumerate(model.blocks) if b.is_moe],
    _attribute(graphdef, params, rest, jnp.asarray(tokens)),
  ):
    contributions = np.asarray(layer["contributions"])
    first_own = names[contributions.shape[0]]
    assert first_own == f"moe{block}.expert0", (block, first_own)  # names follow the parts
    out.append(layer_report(model, block, names, contributions, layer["logits"]))
  return out


def layer_report(model, block: int, names, contributions, logits) -> dict:
  """One MoE block's decomposition as the analyses read it: block, the names of its
  C contributions, contributions [C, T, E], the router's logits, top_k and the
  influence Var_t summed over experts [C]."""
  return {
    "block": block,
    "names": names[: contributions.shape[0]],
    "contributions": contributions,
    "logits": np.asarray(logits),
    "top_k": model.blocks[block].ffn.cfg.top_k,
    "influence": contributions.var(axis=1).sum(axis=-1),
  }


def component_names(model, recursive: bool = False) -> list[str]:
  """The components of the stream in order (_components builds them in this order);
  recursive: the sources of routing_paths instead, where heads are paths and the
  value bias is a source of its own."""
  names = ["embed"]
  for i, block in enumerate(model.blocks):
    if not recursive:
      names += [f"attn{i}.head{h}" for h in range(block.attn.num_heads)]
    elif block.attn.v.bias is not None:
      names.append(f"attn{i}.v_bias")
    if block.attn.o.bias is not None:
      names.append(f"attn{i}.bias")
    if block.is_moe:
      names += [f"moe{i}.expert{e}" for e in range(block.ffn.cfg.num_experts)]
      if block.ffn.shared is not None:
        names.append(f"moe{i}.shared")
    else:
      names.append(f"ffn{i}")
  return names


def influence_by_source(layer: dict) -> dict:
  """One MoE block's influence summed by source: embed, attention of block j
  (its heads and bias), MoE of block j (experts and shared), dense FFN j."""
  out: dict[str, float] = {}
  for name, value in zip(layer["names"], layer["influence"]):
    source = name.split(".")[0]
    out[source] = out.get(source, 0.0) + float(value)
  return out


def source_shares(layers) -> list[dict]:
  """Per MoE layer, each source's fraction of the summed influence, and the
  attention / MoE totals over the earlier layers (the block's own attention
  counted with attention)."""
  out = []
  for layer in layers:
    by_source = influence_by_source(layer)
    total = sum(by_source.values())
    frac = {k: v / total for k, v in by_source.items()}
    out.append(
      {
        "block": layer["block"],
        "share": frac,
        "attention": sum(v for k, v in frac.items() if k.startswith("attn")),
        "moe": sum(v for k, v in frac.items() if k.startswith("moe")),
        "embed": frac.get("embed", 0.0),
      }
    )
  return out


def signed_effects(layer: dict) -> dict:
  """Promote / inhibit effects of each component on one MoE block's routing. Top-k and
  softmax ignore a shift common to all experts, so each contribution is centred over
  experts first: u[c, t, e] = contribution - its mean over e. Returns {"per_expert":
  [C, E] mean over tokens of u (> 0 promotes e, < 0 inhibits it), "on_chosen": [C] mean
  over tokens of u at the token's own top-k experts (of the router's logits), the
  component's net push towards the experts actually chosen}."""
  contributions = np.asarray(layer["contributions"], np.float64)
  centred = contributions - contributions.mean(axis=-1, keepdims=True)
  k = int(layer.get("top_k", 1))
  chosen = np.argsort(-np.asarray(layer["logits"]), axis=-1, kind="stable")[:, :k]  # [T, k]
  picked = np.take_along_axis(centred, chosen[None], axis=-1)  # [C, T, k]
  return {"per_expert": centred.mean(axis=1), "on_chosen": picked.mean(axis=(1, 2))}


def ablate_component(model_cfg, params, name: str) -> dict:
  """A copy of params (loop layout) in which component `name` (component_names) writes
  nothing: a head's rows of W_o, an expert's w_down, a shared expert's or dense FFN's
  output projection set to zero. ValueError for the embedding and biases."""
  out = jax.tree.map(lambda v: v, params)
  source, _, part = name.partition(".")
  if not (source.startswith(("attn", "moe")) and part.startswith(("head", "expert"))):
    raise ValueError(f"cannot ablate component {name!r}: heads and experts only")
  weights = out["blocks"][int(source.lstrip("atnmoe"))]
  if source.startswith("attn") and part.startswith("head"):
    head, kernel = int(part[4:]), weights["attn"]["o"]["kernel"]
    size = kernel.shape[0] // model_cfg.num_heads
    weights["attn"]["o"]["kernel"] = kernel.at[head * size : (head + 1) * size].set(0.0)
  elif source.startswith("moe") and part.startswith("expert"):
    w = weights["ffn"]["experts"]
    w["w_down"] = w["w_down"].at[int(part[6:])].set(0.0)
  else:
    raise ValueError(f"cannot ablate component {name!r}: heads and experts only")
  return out


def flip_rate(reference_sets: np.ndarray, sets: np.ndarray) -> float:
  """Fraction of tokens whose top-k set (bool [T, E]) changed."""
  return float(np.mean(np.any(np.asarray(reference_sets) != np.asarray(sets), axis=-1)))


@functools.partial(jax.jit, static_argnums=0)
def _routed_sets(graphdef, params, rest, tokens):
  model = nnx.merge(graphdef, params, rest)
  _, aux, _ = model(tokens)
  experts = [b.ffn.cfg.num_experts for b in model.blocks if b.is_moe]
  sets = []
  for a, e in zip(aux["moe"], experts):
    rows = jnp.arange(a["expert_index"].shape[0])[:, None]
    counts = jnp.zeros((rows.shape[0], e), jnp.int32)
    counts = counts.at[rows, a["expert_index"]].add(a["valid"].astype(jnp.int32), mode="drop")
    sets.append(counts > 0)
  return sets


def routed_sets(graphdef, params, rest, tokens) -> list[np.ndarray]:
  """Per MoE block (in order), bool [T, E]: the experts each token was routed to."""
  return [np.asarray(s) for s in _routed_sets(graphdef, params, rest, jnp.asarray(tokens))]


ABLATION_RANKS = ("top", "bottom", "random")


def ablation_candidates(layer: dict) -> list[str]:
  """The components of one MoE block's decomposition that ablate_component can remove:
  attention heads and the experts of earlier MoE blocks."""
  return [n for n in layer["names"] if ".head" in n or ".expert" in n]


def pick_for_ablation(layer: dict, n: int, rank: str, seed: int = 0) -> list[str]:
  """n of ablation_candidates(layer): the most influential ('top'), the least
  ('bottom', ties to the earlier component) or a uniform draw ('random', `seed`)."""
  if rank not in ABLATION_RANKS:
    raise ValueError(f"rank={rank!r} must be one of {', '.join(ABLATION_RANKS)}")
  names = ablation_candidates(layer)
  if not 1 <= n <= len(names):
    raise ValueError(f"n={n} must be in [1, {len(names)}] (the block's candidates)")
  influence = dict(zip(layer["names"], layer["influence"]))
  if rank == "random":
    chosen = np.random.default_rng(seed).choice(len(names), n, replace=False)
    return [names[i] for i in sorted(chosen)]
  sign = -1.0 if rank == "top" else 1.0
  order = sorted(range(len(names)), key=lambda i: (sign * influence[names[i]], i))
  return [names[i] for i in order[:n]]
