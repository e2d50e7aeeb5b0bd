"""HEAPr (ICLR 2026, arXiv 2509.22299): prune the atoms of SwiGLU experts by a
factorised second-order (OBS) cost, ranked globally over every MoE layer.

Atom k of expert e is hidden unit k: column k of w_gate[e] and w_up[e], row w_k
of w_down[e]. On calibration token t routed to e with combine weight g_{t,e},
h_{t,k} = silu(x_t . w_gate[:, k]) (x_t . w_up[:, k]) is the down projection's
input and removing the atom changes the expert's output by -h_{t,k} w_k. With
g~_t = dL/d(expert output) = g_{t,e} dL/dy_t (L the mean next-token loss over N
predicted tokens, y the layer output) and P_{t,k} = g~_t . w_k:

  first order   D1_{e,k} = -sum_{t in e} h_{t,k} P_{t,k}
  OBS cost      1/2 dw^T F dw with F the empirical Fisher of the per-token losses,
                per token only (N dL/dy_t as token t's own gradient):
                  exact    C_{e,k} = N/2 sum_{t in e} h_{t,k}^2 P_{t,k}^2
                  HEAPr    S_{e,k} = N/2 (1/n_e) sum_t h_{t,k}^2 * sum_t P_{t,k}^2
                           = N/2 * sum_t h^2 * w_k^T M_e w_k / n_e,  M_e = sum_t g~ g~^T,
                the paper's factorisation mean_t(h^2) * w^T M_e w (h and g~
                treated as independent), scaled by the expert's routed tokens n_e
                so that atoms of busy and idle experts are comparable.

HEAPr ranks every atom of every layer by S and keeps the top fraction (the
released code, LLIKKE/HEAPr pruning/pruning_global.py, ranks globally and
slices each expert to its kept atoms; its score computation was not in the
released files). Guesses: the n_e / N scaling above, the per-token Fisher
(cross-position terms dropped), no first-order term in the paper's score
(`first_order=True` adds D1, our variant, exact at first order on the
calibration set).

Removal (`remove_atoms`): each expert's kept atoms move to the front of its hidden axis
and the rest are zero; the model's expert_d_ff becomes the most atoms any expert keeps,
rounded up to 8 (exports need it, `remove_atoms`). A zero atom adds exactly nothing
(silu(0) * 0 = 0, and its w_down row is 0), so the pruned model equals the source with
the removed atoms zeroed (`zero_atoms`), and the parameter count that matters, the kept
atoms, is reported by `kept_parameters`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.models.capture import routed_rows
from moejax.posttrain.methods import NORMALISATIONS

SCORES = ("heapr", "heapr_first_order", "exact_diagonal", "magnitude", "random")
# HEAPr's per-expert normalisation of sum_t h^2 * sum_t P^2 (module doc),
# methods.NORMALISATIONS: `routed` divides by n_e (our default: the token-summed
# cost when h and P are independent), `mean` by n_e^2 (the paper's
# mean_t(h^2) * w^T M_e w with M_e a mean over the expert's tokens, read
# literally), `sum` by nothing.


def _segment(values_RxK, expert_R, num_experts):
  return jax.ops.segment_sum(values_RxK, expert_R, num_segments=num_experts + 1)[:num_experts]


@functools.partial(jax.jit, static_argnums=0)
def batch_atom_sums(graphdef, params, rest, tokens):
  """Per MoE block, the sums of the module doc over one batch [B, L]:
  h2 = sum h^2, p2 = sum P^2, hp = sum h P, h2p2 = sum h^2 P^2 [E, F],
  count [E] routed tokens, and `predicted` N (float32). P uses dL/dy of this
  batch's mean loss times this batch's N, so sums over batches add up."""
  from moejax.assignment.layout import tile_layout
  from moejax.dispatch.grouped_matmul import resolve_grouped_matmul
  from moejax.posttrain.taylor import token_gradients
  from moejax.routing.base import Routing

  model = nnx.merge(graphdef, params, rest)
  grads, moe, token_loss = token_gradients(graphdef, params, rest, tokens)
  predicted = jnp.asarray(token_loss.shape[0], jnp.float32)
  out = {}
  for block, (x, aux) in moe.items():
    layer = model.blocks[block].ffn
    if layer.expert_type.name != "swiglu":
      raise ConfigError(
        f"block {block}: atoms are the hidden units of SwiGLU experts, "
        f"not of model.moe.experts={layer.expert_type.name!r}"
      )
    e = layer.cfg.num_experts
    w = layer.experts.weights(jnp.float32)
    routing = Routing(aux["expert_index"], aux["combine_weight"], aux["valid"])
    layout = tile_layout(routing, e, 1)
    matmul = resolve_grouped_matmul("ragged_dot").build(layout, layer.cfg)
    rows = routed_rows(layer, x, aux)
    xr = x.astype(jnp.float32)[layout.row_token]
    hidden = jax.nn.silu(matmul(xr, w["w_gate"])) * matmul(xr, w["w_up"])  # [R, F]
    g = rows["weight"][:, None] * grads[block][rows["token"]] * predicted  # [R, d]
    proj = matmul(g, jnp.swapaxes(w["w_down"], 1, 2))  # [R, F]: g~ . w_k
    expert = rows["expert"]
    out[block] = {
      "h2": _segment(hidden**2, expert, e),
      "p2": _segment(proj**2, expert, e),
      "hp": _segment(hidden * proj, expert, e),
      "h2p2": _segment((hidden * proj) ** 2, expert, e),
      "count": _segment(jnp.ones_like(rows["weight"]), expert, e),
      "predicted": predicted,
    }
  return out


def atom_sums(graphdef, params, rest, batches) -> dict:
  """batch_atom_sums added over token batches, in float64 on the host."""
  total = None
  for tokens in batches:
    sums = jax.device_get(batch_atom_sums(graphdef, params, rest, jnp.asarray(tokens)))
    sums = {b: {k: np.asarray(v, np.float64) for k, v in s.items()} for b, s in sums.items()}
    total = (
      sums
      if total is None
      else {b: {k: total[b][k] + v for k, v in s.items()} for b, s in sums.items()}
    )
  if total is None:
    raise ConfigError("no calibration batch was given")
  return total


def atom_scores(
  sums: dict,
  score: str = "heapr",
  params: dict | None = None,
  seed=0,
  normalisation: str = "routed",
) -> dict:
  """{block: [E, F]} predicted loss increase of removing each atom alone (module
  doc), or a baseline: `magnitude` ||w_gate_k|| ||w_up_k|| ||w_down_k|| (needs
  params), `random`. normalisation: HEAPr's per-expert scaling (NORMALISATIONS)."""
  from moejax.errors import choice_error

  if score not in SCORES:
    raise choice_error("score", score, SCORES)
  if normalisation not in NORMALISATIONS:
    raise choice_error("normalisation", normalisation, NORMALISATIONS)
  out = {}
  for block, s in sums.items():
    n = s["predicted"]
    if score == "random":
      out[block] = np.random.default_rng([seed, block]).random(s["h2"].shape)
    elif score == "magnitude":
      if params is None:
        raise ValueError("score='magnitude' ranks atoms by their weights: give params")
      w = {
        name: np.asarray(v, np.float64)
        for name, v in params["blocks"][block]["ffn"]["experts"].items()
      }
      out[block] = (
        np.linalg.norm(w["w_gate"], axis=1)
        * np.linalg.norm(w["w_up"], axis=1)
        * np.linalg.norm(w["w_down"], axis=2)
      )
    elif score == "exact_diagonal":
      out[block] = 0.5 / n * s["h2p2"]
    else:  # P carries a factor N: N/2 * sum h^2 * sum (P/N)^2 / n_e (routed)
      power = {"routed": 1, "mean": 2, "sum": 0}[normalisation]
      routed = np.maximum(s["count"], 1.0)[:, None] ** power
      heapr = 0.5 / n * s["h2"] * s["p2"] / routed
      out[block] = heapr - s["hp"] / n if score == "heapr_first_order" else heapr
  return out


def global_keep(scores: dict, fraction: float) -> dict:
  """{block: bool [E, F]}: the top `fraction` of all atoms of every layer by score
  (ties: lower block, expert, unit first)."""
  if not 0 < fraction <= 1:
    raise ConfigError(f"keep={fraction}: the fraction of atoms kept must be in (0, 1]")
  blocks = sorted(scores)
  flat = np.concatenate([np.asarray(scores[b], np.float64).ravel() for b in blocks])
  count = int(round(fraction * flat.size))
  order = np.argsort(-flat, kind="stable")[:count]
  mask = np.zeros(flat.size, bool)
  mask[order] = True
  out, start = {}, 0
  for b in blocks:
    size = np.size(scores[b])
    out[b] = mask[start : start + size].reshape(np.shape(scores[b]))
    start += size
  return out


def _expert_weights(params, block):
  try:
    return params["blocks"][block]["ffn"]["experts"]
  except (KeyError, TypeError):
    raise ConfigError(f"block {block} has no routed experts") from None


def _with_experts(params: dict, block: int, experts: dict) -> dict:
  out = {**params, "blocks": dict(params["blocks"])}
  out["blocks"][block] = {
    **params["blocks"][block],
    "ffn": {**params["blocks"][block]["ffn"], "experts": experts},
  }
  return out


def zero_atoms(params: dict, keep: dict) -> dict:
  """A copy of params with every atom not in keep[block] (bool [E, F]) zeroed in
  w_gate, w_up and w_down."""
  for block, mask in keep.items():
    w = {k: np.array(v) for k, v in _expert_weights(params, block).items()}
    mask = np.asarray(mask, bool)
    w["w_gate"] = w["w_gate"] * mask[:, None, :]
    w["w_up"] = w["w_up"] * mask[:, None, :]
    w["w_down"] = w["w_down"] * mask[:, :, None]
    params = _with_experts(params, block, w)
  return params


WIDTH_MULTIPLE = 8


def remove_atoms(m, params: dict, keep: dict, width_multiple: int = WIDTH_MULTIPLE):
  """(model config with expert_d_ff = the most atoms any expert keeps, rounded up
  to `width_multiple` and at most the old width, params): each expert's kept atoms
  first, in their order, then zero atoms (module doc). The rounding is for
  exports: transformers' grouped expert matmul (torch._grouped_mm) needs 16-byte
  row strides, 8 bfloat16 atoms, and refuses e.g. a width of 23."""
  most = max(int(np.asarray(mask).sum(axis=1).max()) for mask in keep.values())
  if most == 0:
    raise ConfigError("every atom would be removed")
  width = min(-(-most // width_multiple) * width_multiple, m.moe.expert_d_ff)
  new = ml_collections.ConfigDict(m.to_dict())
  new.moe.expert_d_ff = width
  for block, mask in keep.items():
    w = {k: np.asarray(v) for k, v in _expert_weights(params, block).items()}
    mask = np.asarray(mask, bool)
    if mask.shape != (w["w_gate"].shape[0], w["w_gate"].shape[2]):
      raise ConfigError(
        f"keep[{block}] has shape {mask.shape}; the block's experts are "
        f"{w['w_gate'].shape[0]} x {w['w_gate'].shape[2]} atoms"
      )
    cut = {
      "w_gate": np.zeros(w["w_gate"].shape[:2] + (width,), w["w_gate"].dtype),
      "w_up": np.zeros(w["w_up"].shape[:2] + (width,), w["w_up"].dtype),
      "w_down": np.zeros((w["w_down"].shape[0], width, w["w_down"].shape[2]), w["w_down"].dtype),
    }
    for e, row in enumerate(mask):
      units = np.flatnonzero(row)
      cut["w_gate"][e, :, : units.size] = w["w_gate"][e][:, units]
      cut["w_up"][e, :, : units.size] = w["w_up"][e][:, units]
      cut["w_down"][e, : units.size] = w["w_down"][e][units]
    params = _with_experts(params, block, cut)
  return new, params


def kept_parameters(keep: dict, d_model: int) -> int:
  """Expert parameters of the kept atoms: 3 d per atom (w_gate, w_up, w_down)."""
  return int(sum(np.asarray(mask).sum() for mask in keep.values())) * 3 * d_model
