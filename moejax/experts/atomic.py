"""OmniMoE (Shi et al. 2026, arXiv 2602.05711; code flash-algo/omni-moe,
omni_moe/modules/omni_moe.py): a shared dense SwiGLU plus N atomic experts.

An atomic expert is a vector pair (u_e, d_e) in R^d: a single neuron. With the
Cartesian product router (moejax/routing/product_key.py) picking top_k of
them per token with weights w_te = p_x(i) p_y(j), the layer computes (paper
eq. for Dynamic Expert Assembly, the code's OmniMoE.forward)
    y_t = SwiGLU(x_t) + sum_{e in topk(t)} w_te act(u_e . x_t) d_e
i.e. each token assembles its own width-top_k MLP out of the pool.

OmniMoE is the one MoE layer (moejax/layers/moe.py) with router
'product_key', model.moe.experts='atomic' (this type, registered below) and
one shared expert of width model.moe.shared.d_ff; configs/lm_shakespeare_omnimoe.py.
The atomic type's weights are u [N, d, 1] and d [N, 1, d], a 'hidden width'
of 1, so every dispatcher and grouped matmul runs it.

Two schedules, the same function, chosen by model.moe.grouped_matmul:
  naive          ('fused', and 'auto' on CPU) token-centric: gather u, d per (token,
                 slot), [T, k, d] each, then two batched contractions (the reference; the
                 code's OmniMoE_Pytorch).
  expert_centric the paper's Expert-Centric Scheduling: (token,
                 expert) pairs sorted by expert, each expert's rows computed
                 together against its own u_e, d_e. This reuses the dropless
                 dispatch unchanged (moejax/dispatch/dropless.py) with any
                 other entry of the one grouped-matmul registry
                 (dispatch/grouped_matmul.py):
                   'tiled' each tile of dropless.tile rows (one expert) times its
                           expert's vector: one dense batched einsum that
                           reads u_e, d_e once per tile instead of per row;
                   'loop'  one small matmul per block of one expert's rows
                           (assignment/blocks.py), exact FLOPs, many tiny steps;
                   'ragged_dot', 'gmm' N x FLOPs on CPU;
                   'fused' (and 'auto' on CPU) the naive schedule, which
                           the atomic expert type declares as its fused path.
                 Padding rows (each expert's group is padded to
                 dropless.tile) add compute but nothing to y. The official Triton kernels also
                 group experts that share identical token lists into real
                 GEMMs; we do not.
The default schedule is 'naive': on the 2-core CPU at the LM's layer (T 4096,
d 128, N 4096, k 32) it is 1.4-1.8x faster forward and 2x faster forward+backward
than 'expert_centric' (the sort, the padded row buffer and the row scatter
cost more than the u/d gathers they replace while u, d fit in cache); the
paper's speed-up is a GPU kernel result (Triton) we do not reproduce in XLA.
With N >> T k (few rows per expert) the padded buffer, ~N tile rows, dominates
(N 65536, T 2048, k 16, d 512: 12x slower fwd+bwd).

Settings: model.moe.atomic.activation (silu | gelu | relu).

Guesses (neither paper text nor code fixes them): u and d start truncated
normal with variance 1/d (the code uses nn.Embedding, whose own default is
N(0, 1), and may be re-initialised by its host model); the router kernels use
the dense fan-in init (BatchNorm makes the router scale-invariant). No
auxiliary loss: the code has none (the product_key router gives no probs, so
none applies). Metrics over the N atomic experts: max_over_mean_load,
distinct_experts (used by some assignment of the batch), the padding waste at
model.moe.dropless.tile, routing entropy over all N.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.assignment.layout import padding_waste
from moejax.errors import choice_error
from moejax.experts.base import ExpertType, register_expert_type

ACTIVATIONS = {"silu": jax.nn.silu, "gelu": jax.nn.gelu, "relu": jax.nn.relu}


def validate_atomic_settings(section) -> None:
  if section.activation not in ACTIVATIONS:
    raise choice_error("model.moe.atomic.activation", section.activation, ACTIVATIONS)


def atomic_naive(x, u, d, routing, activation: str):
  """Token-centric reference: y_t = sum_s w_ts act(u[e_ts] . x_t) d[e_ts].

  x [T, d_model] in the compute dtype; u, d [N, d_model]; sums in >= float32.
  """
  acc = jnp.promote_types(jnp.float32, x.dtype)
  index = routing.expert_index
  h = ACTIVATIONS[activation](jnp.einsum("td,tkd->tk", x, u[index].astype(x.dtype)))
  g = h.astype(acc) * routing.masked_weight().astype(acc)
  return jnp.einsum("tk,tkd->td", g, d[index].astype(acc)).astype(x.dtype)


def atomic_expert(weights_e: dict, x, *, activation: str = "silu"):
  """One atomic expert on rows x [n, d]: act(x u_e) d_e with u_e [d, 1], d_e [1, d]."""
  return ACTIVATIONS[activation](x @ weights_e["u"]) @ weights_e["d"]


def atomic_experts(weights: dict, rows, matmul, *, activation: str = "silu"):
  """The expert function of dispatch: rows grouped by expert -> act(rows u_e) d_e."""
  h = ACTIVATIONS[activation](matmul(rows, weights["u"]))  # [R, 1]
  return matmul(h, weights["d"])  # [R, d]


def atomic_fused(weights: dict, x, routing, cfg, *, activation: str = "silu"):
  """The naive (token-centric) schedule as this type's fused path; returns (y, metrics)."""
  y = atomic_naive(x, weights["u"][:, :, 0], weights["d"][:, 0, :], routing, activation)
  counts = routing.expert_counts(weights["u"].shape[0])
  return y, {
    "dropped_fraction": jnp.zeros((), jnp.float32),
    "padding_waste": padding_waste(counts, cfg.dropless.tile),
  }


def atomic_init(rngs: nnx.Rngs, num_experts: int, d_model: int):
  """u or d [N, d_model], truncated normal with variance 1 / d_model (see module doc)."""
  init = jax.nn.initializers.variance_scaling(
    1.0, "fan_in", "truncated_normal", in_axis=-1, out_axis=-2
  )
  return init(rngs.params(), (num_experts, d_model))


class AtomicExperts(nnx.Module):
  """N atomic experts as expert type 'atomic': u [N, d, 1], d [N, 1, d]."""

  LOGICAL_AXES = {"u": ("expert", "embed", None), "d": ("expert", None, "embed")}

  def __init__(self, num_experts: int, d_model: int, *, rngs: nnx.Rngs):
    self.u = nnx.Param(
      atomic_init(rngs, num_experts, d_model)[:, :, None], logical_axes=self.LOGICAL_AXES["u"]
    )
    self.d = nnx.Param(
      atomic_init(rngs, num_experts, d_model)[:, None, :], logical_axes=self.LOGICAL_AXES["d"]
    )

  def weights(self, dtype) -> dict:
    return {"u": self.u[...].astype(dtype), "d": self.d[...].astype(dtype)}


ATOMIC = register_expert_type(
  ExpertType(
    "atomic",
    build=lambda num_experts, d_model, cfg, *, rngs: AtomicExperts(num_experts, d_model, rngs=rngs),
    logical_axes=AtomicExperts.LOGICAL_AXES,
    expert=atomic_expert,
    apply=atomic_experts,
    fused=atomic_fused,
    settings={"activation": "silu"},
    validate=validate_atomic_settings,
  )
)
