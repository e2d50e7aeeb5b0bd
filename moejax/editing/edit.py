"""Apply an edit method to the one Decoder's expert stacks (arXiv 2602.10965).

Closed-form methods (moe_edit, lstsq), MEMIT's schedule over `layers`
(Meng et al. 2023, arXiv 2210.07229): the target z = h_L + delta_e at the last
edited block L (capture.target_deltas), then for block l_i in order, on the
model with the earlier blocks already edited,
  R_t = -(z_t - h_L,t) / (number of edited blocks from l_i on)
(current output minus target: each block closes its share of the gap), keys
and gates of block l_i at the rows, the method's deltas, and
w_down[j] += (Delta_j P_j)^T. The projectors come from the unedited model's
keys on the preserved windows (every routed token of each edited block): an
exact null-space edit leaves those tokens' activations, and so the later
blocks' preserved keys, unchanged. Guess: MEMIT's 1/(blocks left) share
(the MoEEdit code weights the residual by 1/sqrt of it).

finetune: `steps` Adam steps (learning rate `lr`) on the edited blocks' w_down
of every expert, minimising the mean NLL of the edits' continuations.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from moejax.editing import bcd, capture, facts as facts_lib, methods, nullspace


@functools.partial(jax.jit, static_argnums=(0, 4))
def _layer_inputs(graphdef, params, rest, tokens, block: int):
  model = nnx.merge(graphdef, params, rest)
  _, aux, outputs = capture.captured(model, tokens)
  layer = model.blocks[block].ffn
  x = outputs[("blocks", block, "ffn_norm", "__call__")].reshape(-1, model.cfg.d_model)
  return x.astype(jnp.float32), capture.dense_gates(
    aux["moe"][capture.moe_blocks(model).index(block)], layer.cfg.num_experts
  )


def preserved_keys(graphdef, params, rest, windows, block: int, batch_size: int = 8):
  """(keys [R, f] float64, expert [R]) of every routed token of `block` on windows."""
  experts = _experts(params, block)
  keys, owner = [], []
  for i in range(0, len(windows), batch_size):
    x, g = jax.device_get(
      _layer_inputs(graphdef, params, rest, jnp.asarray(windows[i : i + batch_size]), block)
    )
    for e in range(g.shape[1]):
      rows = g[:, e] > 0
      if rows.any():
        one = {k: experts[k][e : e + 1] for k in ("w_gate", "w_up")}
        keys.append(capture.expert_keys(one, x[rows])[:, 0])
        owner.append(np.full(int(rows.sum()), e))
  return np.concatenate(keys), np.concatenate(owner)


def _experts(params, block):
  return params["blocks"][block]["ffn"]["experts"]


def _with_w_down(params, updates: dict):
  """A shallow copy of `params` with w_down of each block in `updates` replaced."""
  blocks = dict(params["blocks"])
  for block, w in updates.items():
    ffn = dict(blocks[block]["ffn"])
    ffn["experts"] = {**ffn["experts"], "w_down": w}
    blocks[block] = {**blocks[block], "ffn": ffn}
  return {**params, "blocks": blocks}


def _finetune_loss(w, graphdef, params, rest, arrays):
  model = nnx.merge(graphdef, _with_w_down(params, w), rest)
  logits = model(arrays["inputs"])[0]
  return jnp.mean(capture._nll(logits, arrays["targets"], arrays["mask"]))


@functools.partial(jax.jit, static_argnums=1)
def _finetune_step(w, graphdef, params, rest, arrays, state, lr):
  value, grad = jax.value_and_grad(_finetune_loss)(w, graphdef, params, rest, arrays)
  updates, state = optax.adam(lr).update(grad, state)
  return optax.apply_updates(w, updates), state, value


def finetune(graphdef, params, rest, batch: capture.EditBatch, layers, *, steps: int, lr: float):
  """(params, NLL [steps]) after Adam on the blocks' w_down (module doc)."""
  arrays = {k: jnp.asarray(getattr(batch, k)) for k in ("inputs", "targets", "mask")}
  w = {b: jnp.asarray(_experts(params, b)["w_down"]) for b in layers}
  state, history = optax.adam(lr).init(w), []
  for _ in range(steps):
    w, state, value = _finetune_step(w, graphdef, params, rest, arrays, state, lr)
    history.append(float(value))
  return _with_w_down(params, jax.tree.map(np.asarray, w)), history


def _cached(cache: dict, key, compute):
  if key not in cache:
    cache[key] = compute()
  return cache[key]


def layer_projectors(graphdef, params, rest, windows, block: int, tol: float):
  keys, owner = preserved_keys(graphdef, params, rest, windows, block)
  e = np.asarray(_experts(params, block)["w_down"]).shape[0]
  return nullspace.layer_projectors(keys, owner, e, tol)


def edit_model(
  m,
  params,
  rest,
  tokenizer,
  prefix_id: int,
  edits,
  bound: methods.Bound,
  preserved: np.ndarray | None = None,
  cache: dict | None = None,
):
  """(edited params, report) of the model config `m` (loop layout) with host
  params: `edits` (facts.Fact) by the bound method; `preserved` int32 [N, L]
  windows for the null-space projectors (moe_edit with project=True). `cache`:
  a dict where the target (which depends on the edits, the model and the common
  settings only) and the projectors are kept for the next method on the same
  edits and model (a study's arms)."""
  cache = {} if cache is None else cache
  from moejax.models.decoder import abstract_model

  methods.check_model(bound, m)
  graphdef = abstract_model(m)[0]
  method, o = bound.method, bound.options
  layers = list(o["layers"])
  batch = capture.encode_rows(tokenizer, prefix_id, facts_lib.edit_rows(edits), o["key_position"])
  report: dict[str, Any] = {
    "method": method.name,
    "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in o.items()},
    "edits": len(edits),
    "rows": int(len(batch.seq)),
    "layers": [],
  }
  if method.kind == "gradient":
    params, history = finetune(graphdef, params, rest, batch, layers, steps=o["steps"], lr=o["lr"])
    report["nll"] = {"before": history[0], "after_last_step": history[-1]}
    return params, report
  project = method.needs_projectors and o.get("project", False)
  if project and preserved is None:
    raise ValueError("moe_edit with the projection needs preserved windows")
  projectors = (
    {
      b: _cached(
        cache,
        ("projectors", b, o["tol"]),
        lambda b=b: layer_projectors(graphdef, params, rest, preserved, b, o["tol"]),
      )
      for b in layers
    }
    if project
    else {}
  )
  solve = method.solve
  if solve is None:
    raise ValueError(f"edit method {method.name!r} ({method.kind}) has no layer solve")
  last = layers[-1]
  common = tuple((k, o[k]) for k in methods.COMMON)
  delta, h, nll0, nll1 = _cached(
    cache,
    ("target", common),
    lambda: capture.target_deltas(
      graphdef,
      params,
      rest,
      batch,
      last,
      steps=o["target_steps"],
      lr=o["target_lr"],
      decay=o["target_decay"],
      clamp=o["clamp"],
    ),
  )
  report["target"] = {
    "nll_before": float(nll0.mean()),
    "nll_with_delta": float(nll1.mean()),
    "delta_over_h": float(
      np.mean(np.linalg.norm(delta, axis=-1)) / np.mean(np.linalg.norm(h, axis=-1))
    ),
  }
  z = h.astype(np.float64) + delta
  tokens, flat = jnp.asarray(batch.inputs), jnp.asarray(batch.flat)
  for i, block in enumerate(layers):
    got = jax.device_get(
      capture.rows_at(graphdef, params, rest, tokens, flat, tuple(sorted({block, last})))
    )
    x, g, _ = got[block]
    R = -(z - got[last][2]) / (len(layers) - i)
    experts = _experts(params, block)
    keys = capture.expert_keys(experts, x)
    P = None
    if project:
      if o["check_capacity"]:
        nullspace.check_capacity(np.asarray(g), projectors[block], block)
      P = np.stack([p.matrix for p in projectors[block]])
    deltas = solve(R, np.asarray(g, np.float64), keys, P, o)
    w = np.asarray(experts["w_down"])
    new = (w.astype(np.float64) + bcd.w_down_update(deltas, P)).astype(w.dtype)
    params = _with_w_down(params, {block: new})
    g64 = np.asarray(g, np.float64)
    report["layers"].append(
      {
        "block": int(block),
        "experts_used": int(np.sum(np.any(g64 > 0, axis=0))),
        "residual_norm": float(np.linalg.norm(R)),
        "objective": [
          bcd.objective(R, g64, keys, np.zeros_like(deltas), 0.0, P),
          bcd.objective(R, g64, keys, deltas, 0.0, P),
        ],
        **(
          {
            "free_dims_min": min(p.free for p in projectors[block]),
            "free_dims_mean": float(np.mean([p.free for p in projectors[block]])),
          }
          if project
          else {}
        ),
      }
    )
  return params, report
