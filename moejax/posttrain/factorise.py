"""Trained SwiGLU experts -> expert type 'factorised' (TD-MoE, ICLR 2026).

`factorise_experts` fits each projection's joint whitened Tucker model
(tucker.td_moe): w_gate and w_up [E, d, f] whitened by the layer's calibration
inputs X [n, d], w_down [E, f, d] by the hidden activations H [n, f] if given
(silu(x W_gate_e) * (x W_up_e) of the tokens routed to e, pooled), else
fitted unwhitened (tucker.tucker). Its output is the state of
experts/factorised.py's FactorisedExperts, projection by projection
{core, expert_factor, input_factor, output_factor}, float32; `factorised_config`
makes the matching config change. Ranks: one (r_E, r_in, r_out) for all three
projections, one per projection, or a parameter budget for the layer's three
tensors together (tucker.allocate_layers on the whitened tensors); a 0 rank
is the full size, as in model.moe.factorised.

Not here yet: capturing X and H from a trained checkpoint and converting every
layer of a workdir (one set of ranks per model: the config holds one).
"""
from __future__ import annotations

import ml_collections
import numpy as np

from moejax.errors import ConfigError
from moejax.experts.factorised import PROJECTIONS, RANK_KEYS
from moejax.posttrain import tucker


def whitened_tensors(experts: dict, calibration_inputs, hidden_inputs=None,
                     damping: float = 1e-6) -> dict:
  """{projection: W~ [E, d_in, d_out]}, each whitened by its inputs (module doc)."""
  inputs = {"w_gate": calibration_inputs, "w_up": calibration_inputs, "w_down": hidden_inputs}
  return {p: (np.asarray(experts[p], np.float64) if inputs[p] is None else
              tucker.whiten(experts[p], tucker.whitening(inputs[p], damping)))
          for p in PROJECTIONS}


def resolve_ranks(shapes: dict, ranks_or_budget, whitened: dict | None = None) -> dict:
  """{projection: (r_E, r_in, r_out)} from a triple, a {projection: triple} dict
  (0 = full size) or an int parameter budget (allocated on `whitened`)."""
  if isinstance(ranks_or_budget, (int, np.integer)) and not isinstance(ranks_or_budget, bool):
    allocated = tucker.allocate_layers([whitened[p] for p in PROJECTIONS], int(ranks_or_budget))
    return dict(zip(PROJECTIONS, allocated))
  if isinstance(ranks_or_budget, dict):
    unknown = set(ranks_or_budget) - set(PROJECTIONS)
    if unknown or len(ranks_or_budget) != len(PROJECTIONS):
      raise ConfigError(f"ranks={ranks_or_budget!r} must give a triple for each of "
                        f"{list(PROJECTIONS)}")
    given = ranks_or_budget
  else:
    given = {p: ranks_or_budget for p in PROJECTIONS}
  out = {}
  for p in PROJECTIONS:
    triple = tuple(given[p])
    if len(triple) != 3:
      raise ConfigError(f"ranks of {p}={triple!r} must be 3 ranks (expert, in, out)")
    out[p] = tuple(int(r) or dim for r, dim in zip(triple, shapes[p]))
  return out


def factorise_experts(experts: dict, calibration_inputs, ranks_or_budget, *,
                      hidden_inputs=None, damping: float = 1e-6,
                      iterations: int = 5) -> tuple[dict, dict]:
  """(params, ranks): TD-MoE of one layer's SwiGLU experts (module doc).

  experts: {w_gate, w_up [E, d, f], w_down [E, f, d]} (the block's experts
  params); calibration_inputs X [..., d]; hidden_inputs H [..., f] or None.
  params: {projection: {core, expert_factor, input_factor, output_factor}},
  float32, what FactorisedExperts stores (nnx.update it in); ranks:
  {projection: (r_E, r_in, r_out)} as fitted (for `factorised_config`).
  """
  shapes = {p: np.shape(experts[p]) for p in PROJECTIONS}
  e, d, f = shapes["w_gate"]
  if shapes["w_up"] != (e, d, f) or shapes["w_down"] != (e, f, d):
    raise ConfigError(f"experts of shapes {shapes} are not SwiGLU experts "
                      "(w_gate, w_up [E, d, f], w_down [E, f, d])")
  whitened = whitened_tensors(experts, calibration_inputs, hidden_inputs, damping)
  ranks = resolve_ranks(shapes, ranks_or_budget, whitened)
  inputs = {"w_gate": calibration_inputs, "w_up": calibration_inputs, "w_down": hidden_inputs}
  params = {}
  for p in PROJECTIONS:
    model = (tucker.tucker(experts[p], ranks[p], iterations) if inputs[p] is None else
             tucker.td_moe(experts[p], inputs[p], ranks[p], damping=damping,
                           iterations=iterations))
    params[p] = {"core": model.core, "expert_factor": model.expert_factor,
                 "input_factor": model.input_factor, "output_factor": model.output_factor}
  return {p: {k: np.asarray(v, np.float32) for k, v in t.items()} for p, t in params.items()}, ranks


def factorised_config(config, ranks: dict) -> ml_collections.ConfigDict:
  """A copy of `config` with model.moe.experts='factorised' at `ranks`
  ({projection: triple}). The swiglu fused path is gone: grouped_matmul 'fused'
  becomes 'auto' and dispatch 'dropless_memeff' becomes 'dropless'."""
  c = ml_collections.ConfigDict(config.to_dict())
  moe = c.model.moe
  moe.experts = "factorised"
  for p in PROJECTIONS:
    moe.factorised[RANK_KEYS[p]] = tuple(int(r) for r in ranks[p])
  if moe.grouped_matmul == "fused":
    moe.grouped_matmul = "auto"
  if moe.dispatch == "dropless_memeff":
    moe.dispatch = "dropless"
  return c
