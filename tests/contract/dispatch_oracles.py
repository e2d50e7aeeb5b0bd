"""Brute-force references for dispatchers and grouped matmuls, written from their
definitions in numpy float64 (nothing here calls the code under test):

  reference_loop   y[t] = sum over kept slots s of weight[t, s] * expert_{e[t, s]}(x[t]),
                   one token and one slot at a time (SwiGLU experts);
  gshard_keep      the capacity drop rule, simulated: experts take assignments in
                   GShard's priority (slot 0 of every token in token order, then slot
                   1, ...) until C = max(min, ceil(factor * T * k / E)) are taken;
                   the rest are dropped (Lepikhin et al. 2020, sec. 2.2);
  per_row          out[r] = rows[r] @ w[expert of r] for every real row r of a
                   tile-padded layout (padding rows carry no assignment).

check_dispatcher and check_grouped_matmul (tests/contract/test_dispatch_contract.py)
raise AssertionError naming the part and what differs.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from moejax.assignment.layout import tile_layout
from moejax.kernels import BACKENDS, DEFAULT_TILING
from moejax.kernels.grouped_matmul import _make_plan
from moejax.dispatch import DISPATCHERS, GROUPED_MATMULS
from moejax.dispatch.base import CAPACITY_DROPS, DROPS_NOTHING
from moejax.config import base_config
from moejax.dispatch.grouped_matmul import GMM, resolve_grouped_matmul
from moejax.experts.swiglu import SWIGLU
from moejax.routing import Routing
from tests.contract.oracles import assert_close
from tests.helpers import moe_cfg

D, F = 8, 12


def expert_weights(seed, num_experts):
  rng = np.random.default_rng(seed)

  def w(*s):
    return (rng.standard_normal(s) / np.sqrt(s[-2])).astype(np.float32)

  return {
    "w_gate": w(num_experts, D, F),
    "w_up": w(num_experts, D, F),
    "w_down": w(num_experts, F, D),
  }


def numpy_expert(weights, e, x):
  g, u = x @ weights["w_gate"][e], x @ weights["w_up"][e]
  return (g / (1 + np.exp(-g)) * u) @ weights["w_down"][e]


def reference_loop(x, routing, weights, keep=None):
  """y[t] = sum over valid (kept) slots of weight * expert(x[t]), one token at a time."""
  x = np.asarray(x, np.float64)
  idx, w, valid = (
    np.asarray(a) for a in (routing.expert_index, routing.combine_weight, routing.valid)
  )
  keep = valid if keep is None else keep
  y = np.zeros_like(x)
  for t in range(x.shape[0]):
    for s in range(idx.shape[1]):
      if keep[t, s]:
        y[t] += w[t, s] * numpy_expert(weights, idx[t, s], x[t])
  return y


def gshard_keep(routing, num_experts, capacity):
  """Brute-force GShard priority: slot 0 of every token, then slot 1, ...; first come first kept."""
  idx, valid = np.asarray(routing.expert_index), np.asarray(routing.valid)
  used = np.zeros(num_experts, int)
  keep = np.zeros_like(valid)
  for s in range(idx.shape[1]):
    for t in range(idx.shape[0]):
      if valid[t, s] and used[idx[t, s]] < capacity:
        keep[t, s] = True
        used[idx[t, s]] += 1
  return keep


def kept(drops: str, routing, cfg):
  """The slots a dispatcher declaring `drops` (moejax/dispatch/base.py) must keep."""
  if drops == DROPS_NOTHING:
    return np.asarray(routing.valid)
  assert drops == CAPACITY_DROPS, f"no oracle for drops={drops!r}"
  t = routing.expert_index.shape[0]
  c = max(cfg.capacity.min, math.ceil(cfg.capacity.factor * t * cfg.top_k / cfg.num_experts))
  return gshard_keep(routing, cfg.num_experts, c)


def random_routing(seed, num_tokens, num_experts, num_slots) -> Routing:
  """Distinct experts per token drawn from a skewed distribution (so capacity drops
  happen), about a fifth of the slots invalid; invalid slots keep a real expert and
  a nonzero weight, which dispatch must ignore."""
  rng = np.random.default_rng(seed)
  p = rng.dirichlet(np.full(num_experts, 0.7))
  index = np.stack(
    [rng.choice(num_experts, num_slots, replace=False, p=p) for _ in range(num_tokens)]
  )
  return Routing(
    jnp.asarray(index, jnp.int32),
    jnp.asarray(rng.uniform(0.2, 1.0, (num_tokens, num_slots)), jnp.float32),
    jnp.asarray(rng.random((num_tokens, num_slots)) < 0.8),
  )


@functools.cache
def _run(spec, cfg):
  """jit(y, d combine_weight of sum(y * proj)), metrics) of dispatcher `spec` at `cfg`."""

  def loss(combine_weight, x, routing, weights, proj):
    y, metrics = spec(x, routing.replace(combine_weight=combine_weight), SWIGLU.bind(weights), cfg)
    return jnp.sum(y * proj), (y, metrics)

  return jax.jit(jax.value_and_grad(loss, has_aux=True))


def check_dispatcher(name: str, seed: int, shape, **settings) -> None:
  """Dispatcher `name` at model.moe settings `settings` on a random routing of `shape`
  (T, E, S): y, the combine-weight gradient and dropped_fraction equal the per-token
  loop over the slots its drop rule keeps (a dropped slot contributes nothing)."""
  spec = DISPATCHERS.get(name)
  t, e, k = shape
  cfg = moe_cfg(dispatch=name, num_experts=e, top_k=k, **settings)
  routing = random_routing(seed, t, e, k)
  rng = np.random.default_rng(seed + 1)
  x = rng.standard_normal((t, D)).astype(np.float32)
  proj = rng.standard_normal((t, D)).astype(np.float32)
  weights = expert_weights(seed + 2, e)
  (_, (y, metrics)), d_weight = _run(spec, cfg)(
    routing.combine_weight, jnp.asarray(x), routing, jax.tree.map(jnp.asarray, weights), proj
  )
  keep = kept(spec.drops, routing, cfg)
  part = f"dispatch {name} {settings} seed {seed} {shape}"
  assert_close(f"{part}: y", y, reference_loop(x, routing, weights, keep))
  expert_out = [[numpy_expert(weights, i, x[r]) @ proj[r] for i in range(e)] for r in range(t)]
  index = np.asarray(routing.expert_index)
  want = np.where(keep, np.take_along_axis(np.asarray(expert_out), index, 1), 0.0)
  assert_close(f"{part}: d combine_weight", d_weight, want)
  valid = np.asarray(routing.valid).sum()
  dropped = float(metrics["dropped_fraction"])
  assert abs(dropped - (1 - keep.sum() / max(valid, 1))) < 1e-6, f"{part}: dropped {dropped}"


def runnable_gmm_backends() -> tuple[str, ...]:
  """The gmm kernel backends that run on this platform, one per distinct kernel plan,
  the default first (on CPU 'auto' and 'reference' run the jnp reference, 'pallas'
  is 'pallas_tpu' interpreted; a compiled kernel for another platform cannot run)."""
  plans: dict = {}
  for backend in (dict(GMM.defaults)["backend"], *BACKENDS):
    try:
      plans.setdefault(_make_plan(backend, None, DEFAULT_TILING), backend)
    except ValueError:
      continue
  return tuple(plans.values())


def group_routing(sizes, seed) -> Routing:
  """One slot per token, sizes[e] tokens on expert e in shuffled order, plus invalid
  slots on random experts."""
  rng = np.random.default_rng(seed)
  experts = np.repeat(np.arange(len(sizes)), sizes)
  invalid = rng.integers(0, len(sizes), 3)
  index = np.concatenate([experts, invalid])
  valid = np.arange(len(index)) < len(experts)
  order = rng.permutation(len(index))
  return Routing(
    jnp.asarray(index[order, None], jnp.int32),
    jnp.ones((len(index), 1), jnp.float32),
    jnp.asarray(valid[order, None]),
  )


def per_row(layout, routing, rows, w, cotangent):
  """(out, d rows, d w) of out[r] = rows[r] @ w[expert of r] on the real rows (others
  0), for the cotangent on those rows, in float64."""
  rows, w, g = (np.asarray(a, np.float64) for a in (rows, w, cotangent))
  assignment = np.asarray(layout.row_assignment)
  index, valid = np.asarray(routing.expert_index)[:, 0], np.asarray(routing.valid)[:, 0]
  out, d_rows, d_w = np.zeros((len(rows), w.shape[2])), np.zeros_like(rows), np.zeros_like(w)
  for r in range(len(rows)):
    a = assignment[r]
    if a < len(index) and valid[a]:
      out[r] = rows[r] @ w[index[a]]
      d_rows[r] = g[r] @ w[index[a]].T
      d_w[index[a]] += np.outer(rows[r], g[r])
  return out, d_rows, d_w


@functools.cache
def _matmul_vjp(spec, cfg):
  """jit((layout, rows, w, cotangent) -> (out, d rows, d w)) of grouped matmul `spec`."""

  def run(layout, rows, w, g):
    out, vjp = jax.vjp(spec.build(layout, cfg), rows, w)
    return (out, *vjp(g))

  return jax.jit(run)


def check_grouped_matmul(name: str, sizes, seed: int, **settings) -> None:
  """Grouped matmul `name` (an entry with `make`) on the layout of expert groups of
  `sizes` rows: its output on every real row and its gradients (rows, w) for a
  cotangent on the real rows equal the dense per-row reference."""
  spec = GROUPED_MATMULS.get(name)
  cfg = moe_cfg(grouped_matmul=name, num_experts=len(sizes), top_k=1, **settings)
  routing = group_routing(sizes, seed)
  layout = tile_layout(routing, len(sizes), cfg.dropless.tile)
  rng = np.random.default_rng(seed + 1)
  rows = rng.standard_normal((layout.num_rows, D)).astype(np.float32)
  w = (rng.standard_normal((len(sizes), D, F)) / np.sqrt(D)).astype(np.float32)
  real = np.asarray(layout.row_assignment) < routing.expert_index.shape[0]  # else padding
  g = np.where(real[:, None], rng.standard_normal((layout.num_rows, F)), 0.0).astype(np.float32)
  out, d_rows, d_w = _matmul_vjp(spec, cfg)(layout, rows, w, g)
  want, want_rows, want_w = per_row(layout, routing, rows, w, g)
  part = f"grouped_matmul {name} {settings} sizes {list(sizes)}"
  assert_close(f"{part}: out (real rows)", np.where(real[:, None], out, 0.0), want)
  assert_close(f"{part}: d rows", d_rows, want_rows)
  assert_close(f"{part}: d w", d_w, want_w)


DEFAULTS = base_config().model.moe
# model.moe.grouped_matmul is read by dropless dispatch (moejax/dispatch/grouped_matmul.py);
# the other dispatchers run at the default and have no grouped-matmul choice.
MATMUL_HOST = "dropless"


def cases(expert_type):
  """(dispatcher, grouped matmul, gmm kernel backend or None) to run for this expert type.

  Every dispatcher at the default grouped matmul, then the grouped-matmul host at
  every registered matmul; an alias ('auto') is left out where it resolves, for
  this type on this platform, to an entry that is run anyway."""
  bound = expert_type.bind({})

  def resolved(name):
    return resolve_grouped_matmul(name, bound).name

  explicit = {name for name, spec in GROUPED_MATMULS.items() if spec.resolve is None}
  out = [
    (name, DEFAULTS.grouped_matmul, None)
    for name in DISPATCHERS
    if not (
      name == MATMUL_HOST
      and resolved(DEFAULTS.grouped_matmul) in explicit
      and DEFAULTS.grouped_matmul not in explicit
    )
  ]
  out += [
    (MATMUL_HOST, name, None)
    for name in GROUPED_MATMULS
    if name != DEFAULTS.grouped_matmul and (name in explicit or resolved(name) not in explicit)
  ]
  # The gmm kernel backends other than the default that are distinct on this platform.
  out += [(MATMUL_HOST, "gmm", backend) for backend in runnable_gmm_backends()[1:]]
  return out
