"""TD-MoE's factorised SwiGLU experts (ICLR 2026): expert type 'factorised'.

Each projection p of the E SwiGLU experts (w_gate, w_up [E, d, f], w_down
[E, f, d]) is one Tucker model of the stacked tensor,
    W_e = U_in G_e U_out^T,   G_e = sum_k U_E[e, k] G[k],
with U_in [d_in, r_in] and U_out [d_out, r_out] shared by all experts
(posttrain/tucker.py fits them offline; posttrain/factorise.py converts a
trained model). Stored, trained (nnx.Params) and checkpointed per projection:
G [r_E, r_in, r_out], U_E [E, r_E], U_in, U_out, the `tucker.Tucker` fields
(core, expert_factor, input_factor, output_factor). The parameter count is
`tucker_parameters`, r_E r_in r_out + E r_E + d_in r_in + d_out r_out: the
shared core with U_E, not per-expert cores G_e (E r_in r_out), because that
is TD-MoE's stored form and its count; G_e is formed from it at every call
(E r_E r_in r_out multiply-adds, tiny beside the tokens' matmuls).

Dispatch. The expert-type contract (experts/base.py) hands every backend
expert-major weights [E, ...], and the contract tests check each backend
against a per-token loop of `factorised_expert` on independent slices w[e].
So `weights(dtype)` returns, per projection, p_in = U_in broadcast to
[E, d_in, r_in], p_core = G_e [E, r_in, r_out] and p_out = U_out^T broadcast
to [E, r_out, d_out]; `apply` runs rows -> r_in -> r_out -> d_out as three
grouped matmuls. The tying lives in the module, not in the function: every
slice is the one stored U_in (jnp.broadcast_to), and the broadcast's gradient
is the sum of the per-expert gradients, i.e. the shared factor's. A grouped
matmul by a broadcast factor does the FLOPs of the shared dense rows @ U_in
(each row meets one slice); XLA may materialise the E copies in the compute
dtype (E (d_in r_in + r_out d_out) per projection, transient). In exchange every
dispatcher, grouped matmul and expert parallelism runs the type unchanged:
EP shards the broadcasts and G_e by 'expert' (each device gets its E / n
slices) and, for w_down's U_in [f, r_in] split over 'mlp', sums the partial
outputs as it does for SwiGLU's row-parallel w_down (every stage is linear).
No fused path ('auto' on CPU picks 'loop').

Settings, model.moe.factorised.ranks_gate / ranks_up / ranks_down: each
(rank_expert, rank_in, rank_out) of that projection, in and out its own
modes (d -> f for gate and up, f -> d for down); 0 means the full size.
validate() checks their form (it sees only this section); ranks larger than
the layer's dimensions are refused, by key and value, where the dimensions are
known: `projection_ranks` in build (E, d_model, expert_d_ff), when the model
is constructed, before anything compiles.

Guess (no paper init for training from scratch): U_E ~ 1/r_E, G ~ 1/r_in,
U_in ~ 1/d_in, U_out ~ 1/r_out (variances, truncated normal), so each W_e
entry has SwiGLU's fan-in variance 1/d_in.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.errors import ConfigError
from moejax.experts.base import ExpertType, GroupedMatmul, register_expert_type
from moejax.registry import settings_of

PROJECTIONS = ("w_gate", "w_up", "w_down")
RANK_KEYS = {"w_gate": "ranks_gate", "w_up": "ranks_up", "w_down": "ranks_down"}
RANK_NAMES = ("rank_expert", "rank_in", "rank_out")
SETTINGS = {key: (0, 0, 0) for key in RANK_KEYS.values()}
# weights(dtype) keys: <short>_in, <short>_core, <short>_out for each projection.
SHORT = {"w_gate": "gate", "w_up": "up", "w_down": "down"}
# (input, output) logical axes of each projection, as SwiGLU's.
MODE_AXES = {"w_gate": ("embed", "mlp"), "w_up": ("embed", "mlp"), "w_down": ("mlp", "embed")}
LOGICAL_AXES = {
  f"{SHORT[p]}_{part}": axes
  for p, (a_in, a_out) in MODE_AXES.items()
  for part, axes in (
    ("in", ("expert", a_in, None)),
    ("core", ("expert", None, None)),
    ("out", ("expert", None, a_out)),
  )
}


def _key(projection: str) -> str:
  return f"model.moe.factorised.{RANK_KEYS[projection]}"


def validate_factorised_settings(section) -> None:
  """Each ranks_* is 3 ints >= 0 (ConfigError naming the key and value)."""
  for projection in PROJECTIONS:
    value = section[RANK_KEYS[projection]]
    ok = (
      isinstance(value, (tuple, list))
      and len(value) == 3
      and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in value)
    )
    if not ok:
      raise ConfigError(
        f"{_key(projection)}={value!r} must be 3 ranks "
        f"({', '.join(RANK_NAMES)}), ints >= 0 (0: the full size)"
      )


def projection_ranks(cfg, num_experts: int, d_model: int, d_ff: int) -> dict:
  """{projection: (r_E, r_in, r_out)} from model.moe.factorised of the layer's
  MoE `cfg`, zeros resolved to full sizes; ConfigError for a rank larger than
  its dimension (naming the key, the value and the dimension)."""
  settings = settings_of(cfg, "factorised", SETTINGS)
  validate_factorised_settings(settings)
  sizes = {"num_experts": num_experts, "d_model": d_model, "expert_d_ff": d_ff}
  out = {}
  for projection in PROJECTIONS:
    value = tuple(settings[RANK_KEYS[projection]])
    modes = (
      "num_experts",
      *(("expert_d_ff", "d_model") if projection == "w_down" else ("d_model", "expert_d_ff")),
    )
    ranks = []
    for name, rank, mode in zip(RANK_NAMES, value, modes):
      if rank > sizes[mode]:
        raise ConfigError(
          f"{_key(projection)}={value!r}: {name}={rank} exceeds {mode}={sizes[mode]}"
        )
      ranks.append(rank or sizes[mode])
    out[projection] = tuple(ranks)
  return out


def tucker_count(shape, ranks) -> int:
  """r_E r_in r_out + E r_E + d_in r_in + d_out r_out (posttrain/tucker.py)."""
  (e, d_in, d_out), (r_e, r_in, r_out) = shape, ranks
  return int(r_e * r_in * r_out + e * r_e + d_in * r_in + d_out * r_out)


def factorised_expert(weights_e: dict, x: jax.Array, **ranks) -> jax.Array:
  """One expert: SwiGLU with each projection x @ U_in @ G_e @ U_out^T (module doc)."""
  del ranks  # the shapes are the weights'

  def project(p, h):
    return h @ weights_e[f"{p}_in"] @ weights_e[f"{p}_core"] @ weights_e[f"{p}_out"]

  return project("down", jax.nn.silu(project("gate", x)) * project("up", x))


def factorised_experts(weights: dict, rows: jax.Array, matmul: GroupedMatmul, **ranks) -> jax.Array:
  """The same on rows grouped by expert: three grouped matmuls per projection."""
  del ranks

  def project(p, h):
    return matmul(matmul(matmul(h, weights[f"{p}_in"]), weights[f"{p}_core"]), weights[f"{p}_out"])

  return project("down", jax.nn.silu(project("gate", rows)) * project("up", rows))


def _init(rngs, shape, in_axis, out_axis, batch_axis=()):
  """Truncated normal of variance 1 / shape[in_axis]."""
  init = jax.nn.initializers.variance_scaling(
    1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis, batch_axis=batch_axis
  )
  return init(rngs.params(), shape, jnp.float32)


class TuckerFactors(nnx.Module):
  """One projection of E experts: W_e = U_in (sum_k U_E[e, k] G[k]) U_out^T."""

  def __init__(self, num_experts: int, d_in: int, d_out: int, ranks, axes, *, rngs: nnx.Rngs):
    r_e, r_in, r_out = ranks
    self.shape, self.ranks = (num_experts, d_in, d_out), tuple(ranks)
    self.core = nnx.Param(
      _init(rngs, (r_e, r_in, r_out), -2, -1, (0,)), logical_axes=(None, None, None)
    )
    self.expert_factor = nnx.Param(
      _init(rngs, (num_experts, r_e), -1, -2), logical_axes=("expert", None)
    )
    self.input_factor = nnx.Param(_init(rngs, (d_in, r_in), -2, -1), logical_axes=(axes[0], None))
    self.output_factor = nnx.Param(
      _init(rngs, (d_out, r_out), -1, -2), logical_axes=(axes[1], None)
    )

  @property
  def parameters(self) -> int:
    return tucker_count(self.shape, self.ranks)

  def expert_cores(self) -> jax.Array:
    """G_e [E, r_in, r_out], float32."""
    return jnp.einsum("ek,kab->eab", self.expert_factor[...], self.core[...])

  def weights(self, dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(U_in, G_e, U_out^T), expert-major [E, ...] in `dtype` (module doc)."""
    e, _, d_out = self.shape
    u_in, u_out = self.input_factor[...].astype(dtype), self.output_factor[...].astype(dtype)
    return (
      jnp.broadcast_to(u_in, (e, *u_in.shape)),
      self.expert_cores().astype(dtype),
      jnp.broadcast_to(u_out.T, (e, u_out.shape[1], d_out)),
    )

  def dense(self) -> jax.Array:
    """W [E, d_in, d_out] (float32; for analysis and tests, not the runtime)."""
    return jnp.einsum(
      "ia,eab,ob->eio", self.input_factor[...], self.expert_cores(), self.output_factor[...]
    )


class FactorisedExperts(nnx.Module):
  """E factorised SwiGLU experts: w_gate, w_up, w_down as TuckerFactors."""

  LOGICAL_AXES = LOGICAL_AXES

  def __init__(self, num_experts: int, d_model: int, d_ff: int, ranks: dict, *, rngs: nnx.Rngs):
    dims = {"w_gate": (d_model, d_ff), "w_up": (d_model, d_ff), "w_down": (d_ff, d_model)}
    for p in PROJECTIONS:
      setattr(self, p, TuckerFactors(num_experts, *dims[p], ranks[p], MODE_AXES[p], rngs=rngs))

  @property
  def parameters(self) -> int:
    """Stored parameters: the sum of the three Tucker counts."""
    return sum(getattr(self, p).parameters for p in PROJECTIONS)

  def weights(self, dtype) -> dict:
    out = {}
    for p in PROJECTIONS:
      for part, w in zip(("in", "core", "out"), getattr(self, p).weights(dtype)):
        out[f"{SHORT[p]}_{part}"] = w
    return out

  def __call__(self, rows, matmul: GroupedMatmul, dtype=jnp.float32):
    return factorised_experts(self.weights(dtype), rows, matmul)


def build_factorised(num_experts: int, d_model: int, cfg, *, rngs: nnx.Rngs):
  """E experts of width model.moe.expert_d_ff at model.moe.factorised's ranks."""
  ranks = projection_ranks(cfg, num_experts, d_model, cfg.expert_d_ff)
  return FactorisedExperts(num_experts, d_model, cfg.expert_d_ff, ranks, rngs=rngs)


FACTORISED = register_expert_type(
  ExpertType(
    "factorised",
    build=build_factorised,
    logical_axes=LOGICAL_AXES,
    expert=factorised_expert,
    apply=factorised_experts,
    settings=SETTINGS,
    validate=validate_factorised_settings,
  )
)
