"""SwiGLU experts (Shazeer 2020), stacked expert-major: expert type 'swiglu'.

Weights: w_gate, w_up [E, d, f] and w_down [E, f, d], float32 parameters cast
to the compute dtype at use. The expert function never sees which token went
where: it receives rows already grouped by the dispatch backend and a
`matmul(rows, w[E, a, b])` that applies each group's own expert slice
(a batched einsum for the capacity layout, a grouped matmul for dropless).
Fused path: the memory-efficient SonicMoE kernel (swiglu_memeff.py).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.experts.base import ExpertType, GroupedMatmul, register_expert_type
from moejax.experts.swiglu_memeff import swiglu_memeff_dispatch


def swiglu_expert(weights_e: dict, x: jax.Array) -> jax.Array:
  """One expert: down(silu(gate(x)) * up(x)); weights_e: w_gate, w_up [d, f], w_down [f, d]."""
  return (jax.nn.silu(x @ weights_e["w_gate"]) * (x @ weights_e["w_up"])) @ weights_e["w_down"]


def swiglu_experts(weights: dict, rows: jax.Array, matmul: GroupedMatmul) -> jax.Array:
  """down(silu(gate(x)) * up(x)) for every row, each with its own expert."""
  hidden = jax.nn.silu(matmul(rows, weights["w_gate"])) * matmul(rows, weights["w_up"])
  return matmul(hidden, weights["w_down"])


def swiglu_fused(weights: dict, x, routing, cfg):
  """The whole SwiGLU expert pass in one block loop (SonicMoE, swiglu_memeff.py)."""
  return swiglu_memeff_dispatch(weights, x, routing, cfg)


class SwiGLUExperts(nnx.Module):
  """E SwiGLU experts of hidden size `d_ff` (fine-grained experts: set freely)."""

  # Logical axes (moejax/sharding.py): experts split over the expert axis,
  # the width column- then row-parallel (Megatron), d_model over fsdp.
  LOGICAL_AXES = {
    "w_gate": ("expert", "embed", "mlp"),
    "w_up": ("expert", "embed", "mlp"),
    "w_down": ("expert", "mlp", "embed"),
  }

  def __init__(
    self, num_experts: int, d_model: int, d_ff: int, *, rngs: nnx.Rngs, init_scale: float = 1.0
  ):
    init = jax.nn.initializers.variance_scaling(
      init_scale, "fan_in", "truncated_normal", in_axis=-2, out_axis=-1, batch_axis=(0,)
    )

    def param(name, shape):
      return nnx.Param(init(rngs.params(), shape), logical_axes=self.LOGICAL_AXES[name])

    self.w_gate = param("w_gate", (num_experts, d_model, d_ff))
    self.w_up = param("w_up", (num_experts, d_model, d_ff))
    self.w_down = param("w_down", (num_experts, d_ff, d_model))

  def weights(self, dtype) -> dict:
    return {name: getattr(self, name)[...].astype(dtype) for name in ("w_gate", "w_up", "w_down")}

  def __call__(self, rows, matmul: GroupedMatmul, dtype=jnp.float32):
    return swiglu_experts(self.weights(dtype), rows, matmul)


def build_swiglu(num_experts: int, d_model: int, cfg, *, rngs: nnx.Rngs) -> SwiGLUExperts:
  """E experts of width model.moe.expert_d_ff."""
  return SwiGLUExperts(num_experts, d_model, cfg.expert_d_ff, rngs=rngs)


SWIGLU = register_expert_type(
  ExpertType(
    "swiglu",
    build=build_swiglu,
    logical_axes=SwiGLUExperts.LOGICAL_AXES,
    expert=swiglu_expert,
    apply=swiglu_experts,
    fused=swiglu_fused,
  )
)
