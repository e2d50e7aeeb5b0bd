"""Trained SwiGLU experts -> expert type 'factorised' (TD-MoE, ICLR 2026).

`factorise_experts` fits each projection's joint whitened Tucker model
(tucker.td_moe): w_gate and w_up [E, d, f] whitened by the layer's calibration
inputs X [n, d], w_down [E, f, d] by the hidden activations H [n, f] if given
(silu(x W_gate_e) * (x W_up_e) of the tokens routed to e, pooled), else
fitted unwhitened (tucker.tucker); given output samples (`routed_outputs`:
each projection's outputs on its routed tokens) the output mode is whitened
too, TD-MoE's multilinear whitening. Its output is the state of
experts/factorised.py's FactorisedExperts, projection by projection
{core, expert_factor, input_factor, output_factor}, float32; `factorised_config`
makes the matching config change. Ranks: one (r_E, r_in, r_out) for all three
projections, one per projection (capped at the dense size if asked), or a parameter
budget for the layer shared by its projections in proportion to their sizes,
each allocated on its own (tucker.allocate_ranks on the whitened tensor); a 0
rank is the full size, as in model.moe.factorised.

Not here yet: capturing X and H from a trained checkpoint and converting every
layer of a workdir (one set of ranks per model: the config holds one).
"""

from __future__ import annotations

import ml_collections
import numpy as np

from moejax.errors import ConfigError
from moejax.experts.factorised import PROJECTIONS, RANK_KEYS
from moejax.posttrain import tucker


def whitened_tensors(
  experts: dict,
  calibration_inputs,
  hidden_inputs=None,
  damping: float = 1e-6,
  output_samples: dict | None = None,
) -> dict:
  """{projection: W~ [E, d_in, d_out]}, each whitened by its inputs and, given
  output_samples {projection: Y [m, d_out]}, by its outputs (module doc)."""
  inputs = {"w_gate": calibration_inputs, "w_up": calibration_inputs, "w_down": hidden_inputs}
  return {
    p: whitened(
      experts[p], inputs[p], None if output_samples is None else output_samples[p], damping
    )
    for p in PROJECTIONS
  }


def whitened(W, inputs=None, outputs=None, damping: float = 1e-6) -> np.ndarray:
  """W~ [E, d_in, d_out] float64: W whitened by its inputs X [n, d_in] (W~_e = S^T W_e)
  and, given outputs Y [m, d_out] too, by them (W~_e R); W itself without inputs."""
  w = np.asarray(W, np.float64)
  if inputs is None:
    return w
  w = tucker.whiten(w, tucker.whitening(inputs, damping))
  if outputs is not None:
    w = np.einsum("ejo,ol->ejl", w, tucker.whitening(outputs, damping))
  return w


def routed_outputs(experts: dict, rows, hidden, expert) -> dict:
  """{projection: Y}: each projection's outputs on its routed calibration inputs,
  pooled over the experts (rows [R, d] and hidden [R, f] of expert ids [R]): the
  samples of TD-MoE's output whitening."""
  out = {}
  for p in PROJECTIONS:
    source = np.asarray(hidden if p == "w_down" else rows, np.float64)
    w = np.asarray(experts[p], np.float64)
    out[p] = np.concatenate([source[expert == e] @ w[e] for e in range(len(w))])
  return out


def resolve_ranks(
  shapes: dict, ranks_or_budget, whitened: dict | None = None, cap: bool = False
) -> dict:
  """{projection: (r_E, r_in, r_out)} from a triple, a {projection: triple} dict
  (0 = full size) or an int parameter budget, shared by the projections in
  proportion to their dense sizes and allocated per tensor on `whitened`
  (TD-MoE's per-tensor allocation; never above a tensor's dense size). With `cap`,
  given ranks that cost more than a projection's dense size become the best ranks
  within it (tucker.capped_ranks, on `whitened`); without, full ranks stay exact."""
  if whitened is None and (cap or isinstance(ranks_or_budget, (int, np.integer))):
    raise ValueError("a parameter budget or cap=True allocates ranks on `whitened`: give it")
  if isinstance(ranks_or_budget, (int, np.integer)) and not isinstance(ranks_or_budget, bool):
    assert whitened is not None  # checked above
    total = sum(tucker.dense_parameters(shapes[p]) for p in PROJECTIONS)
    return {
      p: tucker.allocate_ranks(
        whitened[p], int(ranks_or_budget) * tucker.dense_parameters(shapes[p]) // total
      )
      for p in PROJECTIONS
    }
  if isinstance(ranks_or_budget, dict):
    unknown = set(ranks_or_budget) - set(PROJECTIONS)
    if unknown or len(ranks_or_budget) != len(PROJECTIONS):
      raise ConfigError(
        f"ranks={ranks_or_budget!r} must give a triple for each of {list(PROJECTIONS)}"
      )
    given = ranks_or_budget
  else:
    given = {p: ranks_or_budget for p in PROJECTIONS}
  out = {}
  for p in PROJECTIONS:
    triple = tuple(given[p])
    if len(triple) != 3:
      raise ConfigError(f"ranks of {p}={triple!r} must be 3 ranks (expert, in, out)")
    out[p] = tuple(int(r) or dim for r, dim in zip(triple, shapes[p]))
    if cap:
      assert whitened is not None  # checked above
      out[p] = tucker.capped_ranks(whitened[p], out[p])
  return out


def factorise_experts(
  experts: dict,
  calibration_inputs,
  ranks_or_budget,
  *,
  hidden_inputs=None,
  damping: float = 1e-6,
  iterations: int = 5,
  output_samples: dict | None = None,
) -> tuple[dict, dict]:
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
    raise ConfigError(
      f"experts of shapes {shapes} are not SwiGLU experts "
      "(w_gate, w_up [E, d, f], w_down [E, f, d])"
    )
  whitened = whitened_tensors(experts, calibration_inputs, hidden_inputs, damping, output_samples)
  ranks = resolve_ranks(shapes, ranks_or_budget, whitened)
  inputs = {"w_gate": calibration_inputs, "w_up": calibration_inputs, "w_down": hidden_inputs}
  params = {}
  for p in PROJECTIONS:
    model = (
      tucker.tucker(experts[p], ranks[p], iterations)
      if inputs[p] is None
      else tucker.td_moe(
        experts[p],
        inputs[p],
        ranks[p],
        damping=damping,
        iterations=iterations,
        output_samples=None if output_samples is None else output_samples[p],
      )
    )
    params[p] = {
      "core": model.core,
      "expert_factor": model.expert_factor,
      "input_factor": model.input_factor,
      "output_factor": model.output_factor,
    }
  return {p: {k: np.asarray(v, np.float32) for k, v in t.items()} for p, t in params.items()}, ranks


# The decompositions (methods.DECOMPOSITIONS): decompose(W [E, d_in, d_out], budget,
# inputs=X, outputs=Y, **settings) -> a model with reconstruct(), parameters (at most
# min(budget, E d_in d_out)) and ranks, each at the best ranks within the budget.


def td_moe_experts(W, budget: int, inputs=None, outputs=None, *, damping=1e-6, iterations=5):
  """TD-MoE: the joint Tucker model of W whitened by its inputs X (required) and, given
  them, its outputs Y, at the ranks of least whitened truncation error
  (tucker.allocate_ranks)."""
  _check_inputs("td_moe", inputs)
  ranks = tucker.allocate_ranks(whitened(W, inputs, outputs, damping), budget)
  return tucker.td_moe(
    W, inputs, ranks, output_samples=outputs, damping=damping, iterations=iterations
  )


def tucker_experts(W, budget: int, inputs=None, outputs=None, *, iterations=5):
  """The joint Tucker model of W itself (no whitening; inputs and outputs unread)."""
  return tucker.tucker(W, tucker.allocate_ranks(whitened(W), budget), iterations)


def svd_experts(W, budget: int, inputs=None, outputs=None):
  """Each expert's truncated SVD, at the largest rank within the budget."""
  return tucker.per_expert_svd(W, tucker.svd_rank_for_budget(np.shape(W), budget))


def whitened_svd_experts(W, budget: int, inputs=None, outputs=None, *, damping=1e-6):
  """Each expert's truncated SVD of S^T W_e (SVD-LLM style), S from the inputs X."""
  _check_inputs("whitened_svd", inputs)
  rank = tucker.svd_rank_for_budget(np.shape(W), budget)
  return tucker.whitened_per_expert_svd(W, inputs, rank, damping)


def _check_inputs(name: str, inputs) -> None:
  if inputs is None:
    raise ConfigError(f"{name} whitens by the calibration inputs: give inputs X [n, d_in]")


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
