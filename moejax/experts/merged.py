"""Merged experts: the MoE layer merges expert PARAMETERS per segment of tokens
instead of dispatching tokens (`model.moe.merge`, settings in model.moe.merged).

Each sequence is cut into segments of `segment_len` tokens. A segment's gates are
the softmax of the router on the mean of its (unpadded) inputs,
g = softmax(mean_t(x_t) W_r), over all E experts. Segment s runs ONE expert whose
weights are the merge of the E experts under the gates of segment s - 1 (CAMEx,
arXiv 2502.18821, and its official code: the previous segment's gates, so a token's
output never depends on later tokens). The first segment has no predecessor; it takes uniform
gates 1/E, which use no input at all (CAMEx's code reuses the first segment's own
gates there, which lets a token see later tokens of its segment: not causal).
The final segment of a length that segment_len does not divide is shorter.

Merge rules (MERGE_RULES), for expert weights E_i, gates g_i, base expert E_b:
  smear     sum_i g_i E_i                   (SMEAR, Muqeeth et al., arXiv 2306.03745)
  ep_camex  E_b + eta sum_i g_i tau_i,  tau_i = E_i - E_b   (CAMEx's merge, NAMEx eq. 2,
            with identity curvature M_i = I; the learned Kronecker-factored
            curvature is not built); E_b is a separate expert of the layer
  namex     ep_camex whose base is carried across layers (NAMEx, arXiv 2510.16138,
            eqs. 7-11): only the first MoE layer owns a base expert; with
            Delta E^l = sum_i alpha_i tau_i^l, (G^T G) alpha = 1 / alpha, G = [tau_1 ...
            tau_E] of layer l flattened (alpha from `nash_weights_jnp`, the jit twin of
            moejax.merging.nash.nash_weights), the complex momentum
            mu^{l+1} = beta mu^l + Delta E^l (mu^0 = 0, beta = momentum_real +
            i momentum_imag, mu kept as real and imaginary arrays) and
            E_b^{l+1} = E_b^l + Re(gamma mu^{l+1}) (gamma real). beta = 0 is the plain
            step E_b^l + gamma Delta E^l; a real beta is heavy-ball momentum over layers.
            The decoder threads (E_b, mu) from one MoE layer to the next (`propagate`,
            `pass_carry`; not in a scanned model). With eta = 1 the gates (summing to
            1) cancel the base: ep_camex and namex are then smear.
            alpha is a stop_gradient coefficient (a guess: the paper does not say
            whether the solver is differentiated). A task vector that is exactly 0
            (identical experts, as upcycling starts them) takes no part in the game.

Only expert types whose parameters can be averaged into one expert of the same
type qualify (MERGEABLE_EXPERT_TYPES: 'swiglu'). The routing losses do not apply
(no tokens are dispatched), so model.moe.loss_weights must be empty. Generation
with a KV cache is not covered: one decode step is one token, whose segment
context the layer does not keep.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError, choice_error
from moejax.registry import PartSettings, Registry

NO_MERGE = "none"  # model.moe.merge: dispatch tokens as usual
MERGEABLE_EXPERT_TYPES = ("swiglu",)
NEWTON_STEPS = 60
HALVINGS = 40  # candidate step sizes 1, 1/2, ..., 2^-39 of the twin's line search


@dataclasses.dataclass(frozen=True, eq=False)
class MergeRule:
  """merge(expert_weights {name: [E, ...]}, base {name: [...]} or None, gates [..., E],
  eta) -> {name: [..., ...]}: one merged expert per leading index of `gates`."""

  name: str
  merge: Callable[..., dict]
  needs_base: bool
  carries_base: bool = False  # the base comes from the previous MoE layer (namex)

  @property
  def settings(self) -> dict:
    """The settings every rule shares, in model.moe.merged (SETTINGS)."""
    return dict(SETTINGS.defaults)


MERGE_RULES: Registry[MergeRule] = Registry("model.moe.merge")


def gate_sum(gates, stacked):
  """sum_i gates[..., i] stacked[i] -> [..., *stacked.shape[1:]]."""
  return jnp.tensordot(gates, stacked.astype(gates.dtype), axes=([-1], [0]))


def smear(expert_weights, base, gates, eta):
  """sum_i g_i E_i (SMEAR); no base, no eta."""
  del base, eta
  return {name: gate_sum(gates, w) for name, w in expert_weights.items()}


def ep_camex(expert_weights, base, gates, eta):
  """E_b + eta sum_i g_i (E_i - E_b) (NAMEx eq. 2: CAMEx with identity curvature)."""
  return {
    name: base[name] + eta * gate_sum(gates, w - base[name][None])
    for name, w in expert_weights.items()
  }


MERGE_RULES.add("smear", MergeRule("smear", smear, needs_base=False))
MERGE_RULES.add("ep_camex", MergeRule("ep_camex", ep_camex, needs_base=True))
MERGE_RULES.add("namex", MergeRule("namex", ep_camex, needs_base=True, carries_base=True))


def rule_of(cfg) -> MergeRule | None:
  """The layer's merge rule; None for merge='none' (token dispatch)."""
  name = cfg.get("merge", NO_MERGE)
  if name == NO_MERGE:
    return None
  if name not in MERGE_RULES:
    raise choice_error("model.moe.merge", name, [NO_MERGE, *MERGE_RULES])
  return MERGE_RULES.get(name)


def segment_gates(x_BxLxD, gate_logits, segment_len: int, token_mask=None):
  """(gates [B, n, E] each segment uses, probs [B, n, E] each segment forms), n = the
  number of segments: probs from the masked mean of a segment's inputs, gates the
  previous segment's probs (uniform for the first)."""
  b, length, d = x_BxLxD.shape
  n = math.ceil(length / segment_len)
  mask = jnp.ones((b, length), bool) if token_mask is None else token_mask.astype(bool)
  pad = ((0, 0), (0, n * segment_len - length))
  x = jnp.pad(x_BxLxD, pad + ((0, 0),)).reshape(b, n, segment_len, d)
  weight = jnp.pad(mask, pad).reshape(b, n, segment_len, 1).astype(x.dtype)
  means = jnp.sum(x * weight, 2) / jnp.maximum(jnp.sum(weight, 2), 1.0)
  probs = jax.nn.softmax(gate_logits(means.reshape(b * n, d)), axis=-1).reshape(b, n, -1)
  uniform = jnp.full_like(probs[:, :1], 1.0 / probs.shape[-1])
  return jnp.concatenate([uniform, probs[:, :-1]], axis=1), probs


def merged_forward(
  x_BxLxD, gates_BxNxE, expert, expert_weights, base, rule: MergeRule, segment_len: int, eta: float
):
  """y [B, L, d]: segment s of every row through expert(merge(gates[:, s]), x_s)."""
  b, length, d = x_BxLxD.shape
  n = gates_BxNxE.shape[1]
  x = jnp.pad(x_BxLxD, ((0, 0), (0, n * segment_len - length), (0, 0)))
  merged = rule.merge(expert_weights, base, gates_BxNxE.astype(x.dtype), eta)
  y = jax.vmap(jax.vmap(expert))(merged, x.reshape(b, n, segment_len, d))
  return y.reshape(b, n * segment_len, d)[:, :length]


def gate_metrics(gates_BxNxE) -> dict:
  """Mean gate per expert (the layer's `load_fraction`), its max/mean, gate entropy."""
  fraction = jnp.mean(gates_BxNxE.reshape(-1, gates_BxNxE.shape[-1]), axis=0)
  entropy = -jnp.sum(gates_BxNxE * jnp.log(jnp.maximum(gates_BxNxE, 1e-30)), -1)
  return {
    "load_fraction": fraction,
    "max_over_mean_load": jnp.max(fraction) / jnp.maximum(jnp.mean(fraction), 1e-9),
    "gate_entropy": jnp.mean(entropy),
  }


def layer_aux(gates_BxNxE, length: int, segment_len: int, token_mask=None) -> dict:
  """The MoE layer's aux for a merged call: no routing loss, the gate metrics, and as
  the routing each token's largest gate (expert_index, combine_weight [T, 1])."""
  per_token = jnp.repeat(gates_BxNxE, segment_len, axis=1)[:, :length]
  per_token = per_token.reshape(-1, per_token.shape[-1])
  valid = jnp.ones((per_token.shape[0], 1), bool)
  if token_mask is not None:
    valid = valid & token_mask.reshape(-1, 1)
  return {
    "aux_loss": jnp.zeros((), jnp.float32),
    "metrics": gate_metrics(gates_BxNxE),
    "step_stats": {},
    "expert_index": jnp.argmax(per_token, -1)[:, None].astype(jnp.int32),
    "combine_weight": jnp.max(per_token, -1, keepdims=True),
    "valid": valid,
  }


# ---- NAMEx: the base carried to the next layer


def nash_weights_jnp(gram, steps: int = NEWTON_STEPS):
  """alpha > 0 with gram @ alpha = 1 / alpha, inside jit: the damped Newton of
  moejax.merging.nash.nash_weights (same start sqrt(1 / diag K), same objective
  1/2 a^T K a - sum log a), a fixed number of steps; each step takes the largest of
  1, 1/2, ... that stays positive and does not raise the objective (else none)."""
  k = jnp.asarray(gram)
  ts = 0.5 ** jnp.arange(HALVINGS, dtype=k.dtype)

  def objective(a):
    logs = jnp.log(jnp.where(a > 0, a, 1.0))
    return 0.5 * jnp.einsum("...i,ij,...j->...", a, k, a) - jnp.sum(logs, -1)

  def step(_, alpha):
    gradient = k @ alpha - 1.0 / alpha
    direction = jnp.linalg.solve(k + jnp.diag(1.0 / alpha**2), gradient)
    candidates = alpha[None] - ts[:, None] * direction[None]
    ok = jnp.all(candidates > 0, -1) & (objective(candidates) <= objective(alpha))
    return jnp.where(jnp.any(ok), candidates[jnp.argmax(ok)], alpha)

  return jax.lax.fori_loop(0, steps, step, jnp.sqrt(1.0 / jnp.diag(k)))


def nash_step(base, expert_weights):
  """Delta E = sum_i alpha_i tau_i, tau_i = E_i - E_b, alpha = nash_weights(G^T G) with G
  the task vectors of every weight flattened into one column each (NAMEx eqs. 7-9).

  A task vector that is exactly 0 takes no part: its row and column of G^T G become
  the identity's, which leaves the other alphas those of the game without it (the
  objective separates), and its alpha is set to 0. All zero: Delta E = 0."""
  taus = {name: w - base[name][None] for name, w in expert_weights.items()}
  g = jnp.concatenate([t.reshape(t.shape[0], -1) for t in taus.values()], axis=1)
  g = g.astype(jnp.promote_types(jnp.float32, g.dtype))
  gram = jax.lax.stop_gradient(g @ g.T)
  taking_part = jnp.diag(gram) > 0
  both = taking_part[:, None] & taking_part[None, :]
  gram = jnp.where(both, gram, jnp.eye(gram.shape[0], dtype=gram.dtype))
  alpha = jnp.where(taking_part, nash_weights_jnp(gram), 0.0)
  return {name: gate_sum(alpha.astype(tau.dtype), tau) for name, tau in taus.items()}


def initial_carry(base) -> dict:
  """What the first NAMEx layer starts from: its own base expert, momentum mu = 0."""
  zeros = {name: jnp.zeros_like(w) for name, w in base.items()}
  return {"base": base, "momentum_real": zeros, "momentum_imag": dict(zeros)}


def propagate(carry, expert_weights, gamma: float, beta: complex) -> dict:
  """The carry the next MoE layer merges with (NAMEx eqs. 9-11): with Delta E from
  `nash_step` on this layer's experts and carried base, mu <- beta mu + Delta E and
  E_b <- E_b + Re(gamma mu), the complex mu held as its real and imaginary parts."""
  step = nash_step(carry["base"], expert_weights)
  real, imag = carry["momentum_real"], carry["momentum_imag"]
  new_real = {n: beta.real * real[n] - beta.imag * imag[n] + step[n] for n in step}
  new_imag = {n: beta.real * imag[n] + beta.imag * real[n] for n in step}
  return {
    "base": {n: carry["base"][n] + gamma * new_real[n] for n in step},
    "momentum_real": new_real,
    "momentum_imag": new_imag,
  }


def pass_carry(aux, carry):
  """(aux without its "carry", the carry the next MoE layer receives), in the model's
  loop over blocks; a block without one (dense) passes `carry` on."""
  if aux is None or "carry" not in aux:
    return aux, carry
  aux = dict(aux)
  return aux, aux.pop("carry")


def momentum_of(settings: dict) -> complex:
  """NAMEx's beta from model.moe.merged.momentum_real and momentum_imag."""
  return complex(settings["momentum_real"], settings["momentum_imag"])


# ---- settings


def _validate(e) -> None:
  section = e.get("merged") or {}
  values = {key: section.get(key, default) for key, default in SETTINGS.defaults}
  segment_len = values.pop("segment_len")
  if isinstance(segment_len, bool) or not isinstance(segment_len, int) or segment_len < 1:
    raise ConfigError(f"model.moe.merged.segment_len={segment_len!r} must be an int >= 1")
  for key, value in values.items():
    low = 0 if key in ("eta", "gamma") else -math.inf
    if isinstance(value, bool) or not (
      isinstance(value, (int, float)) and math.isfinite(value) and value >= low
    ):
      bound = " >= 0" if low == 0 else ""
      raise ConfigError(f"model.moe.merged.{key}={value!r} must be a finite number{bound}")
  rule = rule_of(e)
  for key in ("momentum_real", "momentum_imag"):
    if values[key] and (rule is None or not rule.carries_base):
      raise ConfigError(
        f"model.moe.merged.{key}={values[key]!r} is NAMEx's momentum over layers: it "
        "needs model.moe.merge='namex'"
      )
  if rule is None:
    return
  name = rule.name
  if e.get("experts", "swiglu") not in MERGEABLE_EXPERT_TYPES:
    raise ConfigError(
      f"model.moe.experts={e.experts!r}: model.moe.merge={name!r} averages "
      f"expert parameters, which only {list(MERGEABLE_EXPERT_TYPES)} allow"
    )
  if e.get("router", "topk") != "topk":
    raise ConfigError(
      f"model.moe.router={e.router!r}: model.moe.merge={name!r} gates by the "
      "softmax of the plain router kernel (router 'topk'; top_k unused)"
    )
  if e.shared.count:
    raise ConfigError(
      f"model.moe.shared.count={e.shared.count}: model.moe.merge="
      f"{name!r} runs no shared expert (set 0)"
    )
  if e.get("loss_weights"):
    raise ConfigError(
      f"model.moe.loss_weights={dict(e.loss_weights)}: model.moe.merge="
      f"{name!r} dispatches no tokens, so no routing loss applies (set {{}})"
    )


SETTINGS = PartSettings(
  "merged",
  "merged experts (model.moe.merge)",
  (
    ("segment_len", 16),
    ("eta", 1.0),
    ("gamma", 1.0),
    ("momentum_real", 0.0),
    ("momentum_imag", 0.0),
  ),
  validate=_validate,
)
