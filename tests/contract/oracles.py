"""The one reference every registered part is checked against (tests/contract/).

The per-token loop, written plainly:
    y[t] = sum over valid slots s of  weight[t, s] * expert(weights[e[t, s]], x[t])
one token and one slot at a time, in float64, with the expert type's own
per-expert function (ExpertType.expert) on the slices weights[e]. Its
gradients with respect to x, the expert weights and the combine weights come
from autodiff of that same loop (jax.enable_x64).

The check_* functions raise AssertionError naming the part and what differs
when a part breaks its contract. test_*_contract.py call them for every entry
of the registries (expert types, dispatchers, grouped matmuls here; routers and
losses in router_oracles.py); test_wrong_parts_fail.py registers broken parts for
the duration of a test and shows that the checks reject them.

Shapes are tiny so that each check compiles in seconds: T = 10 tokens, E = 5
experts (expert 4 gets no row: an empty group), S = 3 slots per token, some
invalid (token 1 has none), d = 8, SwiGLU width 6, dropless tile 3 (groups
end mid-tile) and block 6 (two block sizes, 6 and 3).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax.config import base_config
from moejax.validation import validate_moe
from moejax.dispatch import DISPATCHERS
from moejax.dispatch.grouped_matmul import resolve_grouped_matmul
from moejax.errors import ConfigError
from moejax.experts import experts_of
from moejax.experts.compressed import CompressedWeight
from moejax.routing import Routing

T, E, S, D, F = 10, 5, 3, 8, 6
TILE, BLOCK = 3, 6
TOL = 1e-5  # fp32 against the float64 loop, relative to the largest reference entry


def contract_cfg(**overrides) -> ml_collections.FrozenConfigDict:
  """The default model.moe section at the contract shapes, validated, with overrides.

  capacity.factor = E: every expert has room for all T * S assignments, so no
  dispatcher may drop one (and the per-token loop, which drops nothing,
  stays the reference for every dispatcher)."""
  c = base_config().model.moe
  c.update(
    dict(
      num_experts=E,
      top_k=S,
      expert_d_ff=F,
      dropless=dict(tile=TILE, block=BLOCK),
      capacity=dict(factor=float(E), min=1),
      topk_rounded=dict(tile=TILE),
    )
  )
  if "loss_weights" in overrides:  # replaced whole (ConfigDict.update would merge)
    c.loss_weights = ml_collections.ConfigDict(overrides.pop("loss_weights"))
  c.update(overrides)
  validate_moe(c, num_layers=2)
  return ml_collections.FrozenConfigDict(c)


def f64(tree):
  return jax.tree.map(lambda a: jnp.asarray(np.asarray(a, np.float64)), tree)


def per_token_loop(expert, weights, x, index, weight, valid, options):
  """y[t] = sum_s [valid] weight[t, s] * expert({k: w[e[t, s]]}, x[t]), token by token
  (a lax.map over tokens, so it compiles once), slot by slot."""

  def one_token(token):
    x_t, index_t, weight_t, valid_t = token
    y_t = jnp.zeros(x_t.shape, x_t.dtype)
    for s in range(index_t.shape[0]):
      weights_e = {name: w[index_t[s]] for name, w in weights.items()}
      out = expert(weights_e, x_t[None, :], **options)[0]
      y_t = y_t + jnp.where(valid_t[s], weight_t[s], 0.0) * out
    return y_t

  return jax.lax.map(one_token, (x, index, weight, valid))


def reference(expert, weights, x, routing: Routing, proj, options):
  """(y, grads) of the per-token loop in float64; loss = sum(y * proj), grads of
  (x, weights, combine_weight)."""
  with jax.enable_x64(True):

    def loss(x, weights, weight, proj):
      y = per_token_loop(expert, weights, x, routing.expert_index, weight, routing.valid, options)
      return jnp.sum(y * proj), y

    (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
      f64(x), f64(weights), f64(routing.combine_weight), f64(proj)
    )
    return np.asarray(y), jax.tree.map(np.asarray, grads)


def assert_close(what: str, got, want, tol: float = TOL) -> None:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
  assert np.all(np.isfinite(got)), f"{what}: not finite"
  scale = max(float(np.max(np.abs(want))), 1e-6)
  err = float(np.max(np.abs(got - want))) / scale
  assert err <= tol, (
    f"{what}: max |got - want| / max |want| = {err:.3g} > {tol:g} (max |want| = {scale:.3g})"
  )


def contract_routing(seed: int = 0) -> Routing:
  """Distinct experts per token from 0..E-2 (expert E-1 stays empty); about a
  quarter of the slots invalid, token 0 all valid, token 1 none. Invalid slots
  carry a nonzero weight and a real expert index: dispatch must ignore both."""
  rng = np.random.default_rng(seed)
  index = np.stack([rng.choice(E - 1, S, replace=False) for _ in range(T)])
  valid = rng.random((T, S)) < 0.75
  valid[0], valid[1] = True, False
  weight = rng.uniform(0.2, 1.0, (T, S))
  return Routing(
    jnp.asarray(index, jnp.int32), jnp.asarray(weight, jnp.float32), jnp.asarray(valid)
  )


@dataclasses.dataclass(frozen=True)
class ExpertCase:
  weights: dict
  x: jax.Array
  routing: Routing
  proj: jax.Array
  options: dict
  y: np.ndarray  # reference output
  grads: tuple  # reference (d x, d weights, d combine_weight)


def expert_case(expert_type) -> ExpertCase:
  """Weights of the shapes the type builds, inputs, and the reference: computed
  once per (expert function, build, settings), so a type that reuses another's
  (test_wrong_parts_fail.py) reuses its reference too."""
  return _expert_case(
    expert_type.expert,
    expert_type.build,
    tuple(sorted(expert_type.settings.items())),
    tuple(sorted(expert_type.code_levels.items())),
  )


@functools.cache
def _expert_case(expert, build, settings, code_levels=()) -> ExpertCase:
  options = dict(settings)  # the type's defaults (contract_cfg leaves them)
  shapes = jax.eval_shape(
    lambda: build(E, D, contract_cfg(), rngs=nnx.Rngs(0)).weights(jnp.float32)
  )
  weights = random_weights(shapes, code_levels=dict(code_levels))
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((T, D)), jnp.float32)
  proj = jnp.asarray(rng.standard_normal((T, D)), jnp.float32)
  routing = contract_routing()
  y, grads = reference(expert, weights, x, routing, proj, options)
  return ExpertCase(weights, x, routing, proj, options, y, grads)


def random_weights(shapes: dict, seed: int = 0, code_levels=None) -> dict:
  """Standard normal over sqrt(fan-in) (the second-to-last axis), float32; the
  weights named in code_levels ({name: levels}, ExpertType.code_levels) integers
  drawn uniformly in [0, levels)."""
  rng = np.random.default_rng(seed)
  code_levels = code_levels or {}

  def draw(key, shape):
    if key in code_levels:
      return rng.integers(0, code_levels[key], shape)
    return rng.standard_normal(shape) / np.sqrt(shape[-2])

  return {key: jnp.asarray(draw(key, s.shape), jnp.float32) for key, s in sorted(shapes.items())}


def check_expert_type(expert_type) -> None:
  """What an ExpertType declares about its parameters is what `build` makes."""
  cfg = contract_cfg(experts=expert_type.name)

  def build():
    return expert_type.build(E, D, cfg, rngs=nnx.Rngs(0))

  module = nnx.eval_shape(build)
  weights = jax.eval_shape(lambda: build().weights(jnp.float32))
  name = expert_type.name
  assert set(weights) == set(expert_type.logical_axes), (
    f"{name}: weights {sorted(weights)} vs logical_axes {sorted(expert_type.logical_axes)}"
  )
  for key, w in weights.items():
    axes = expert_type.logical_axes[key]
    assert w.shape[0] == E, f"{name}.{key}: shape {w.shape} is not expert-major [E={E}, ...]"
    assert len(axes) == len(w.shape) and axes[0] == "expert", f"{name}.{key}: {axes}, {w.shape}"
    assert w.dtype == jnp.float32, f"{name}.{key}: weights(float32) gave {w.dtype}"
  # Trained weights are nnx.Params; compressed types hold theirs as CompressedWeight
  # variables (checkpointed, never trained). Either way they carry logical axes.
  params = [
    (path, var)
    for path, var in nnx.iter_graph(module)
    if isinstance(var, (nnx.Param, CompressedWeight))
  ]
  assert params, f"{name}: build made no nnx.Param (nor CompressedWeight)"
  for path, var in params:
    axes = var.get_metadata().get("logical_axes")
    assert axes is not None and len(axes) == len(var.shape), f"{name}{path}: logical axes {axes}"
  # Older callers' functools.partial(apply, weights), and expert parallelism's
  # partial(bound.apply, local weights), bind the same type with the same options.
  bound = experts_of(functools.partial(expert_type.apply, weights))
  assert bound is not None and bound.type is expert_type, f"{name}: experts_of(partial) = {bound}"
  options = expert_type.parse(cfg)
  local = experts_of(functools.partial(expert_type.bind(weights, cfg).apply, weights))
  assert local is not None and local.type is expert_type and dict(local.options) == options, (
    f"{name}: experts_of(partial(bound.apply, w)) = {local}"
  )
  rows = jax.eval_shape(
    lambda: expert_type.expert(
      {k: jnp.zeros(w.shape[1:], w.dtype) for k, w in weights.items()}, jnp.ones((2, D)), **options
    )
  )
  assert rows.shape == (2, D), f"{name}.expert: rows [2, {D}] -> {rows.shape}"


def check_dispatch(
  expert_type, dispatcher: str, grouped_matmul: str, tol: float = TOL, **cfg_overrides
) -> None:
  """Forward output and gradients (x, expert weights, combine weights) of
  dispatcher + grouped matmul on this expert type equal the per-token loop.

  A combination that runs the fused path of a type that declares none (a
  grouped matmul resolving to 'fused', or a dispatcher that always runs it)
  must raise a ConfigError naming the fused path instead, from config
  validation or from the call."""
  part = f"{expert_type.name} / dispatch {dispatcher} / grouped_matmul {grouped_matmul}"
  needs_fused = grouped_matmul == "fused" or dispatcher == "dropless_memeff"

  def refused(err):
    return expert_type.fused is None and needs_fused and "fused path" in str(err)

  try:
    cfg = contract_cfg(
      experts=expert_type.name, dispatch=dispatcher, grouped_matmul=grouped_matmul, **cfg_overrides
    )
  except ConfigError as err:
    if refused(err):
      return
    raise
  case = expert_case(expert_type)
  dispatch = DISPATCHERS.get(dispatcher)

  def loss(x, weights, combine_weight):
    routing = case.routing.replace(combine_weight=combine_weight)
    y, metrics = dispatch(x, routing, expert_type.bind(weights, cfg), cfg)
    return jnp.sum(y * case.proj), (y, metrics)

  run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
  args = (case.x, case.weights, case.routing.combine_weight)
  try:
    (_, (y, metrics)), (dx, dweights, dweight) = run(*args)
  except ConfigError as err:
    if refused(err):
      return
    raise
  if resolve_grouped_matmul(grouped_matmul, expert_type.bind(case.weights)).fused and (
    expert_type.fused is None
  ):
    raise AssertionError(f"{part}: no fused path declared, yet no ConfigError")
  assert y.dtype == case.x.dtype, f"{part}: y is {y.dtype}, x is {case.x.dtype}"
  if "dropped_fraction" in metrics:
    assert float(metrics["dropped_fraction"]) == 0.0, f"{part}: dropped with room for all"
  want_dx, want_dweights, want_dweight = case.grads
  assert_close(f"{part}: y", y, case.y, tol)
  assert_close(f"{part}: d x", dx, want_dx, tol)
  for key in case.weights:
    assert_close(f"{part}: d {key}", dweights[key], want_dweights[key], tol)
  assert_close(f"{part}: d combine_weight", dweight, want_dweight, tol)
