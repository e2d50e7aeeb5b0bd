"""The contract every registered post-training method is held to (the protocols of
moejax/posttrain/methods.py), checked from outside the method, with oracles that
can fail:

  every method   binds its declared defaults; an unknown setting, or a value not of
                 its default's type, is a ConfigError naming `--key=value`.
  pruner         expert: for every m, the selection is m distinct experts in [0, E),
                 sorted, the same on a second call; given only the statistics it
                 declares (`needs`). atom: a finite score [E, F] for every atom of
                 every layer. Both, through prune.prune_model: keeping every expert
                 (keep=1.0) returns the model unchanged; an expert pruner at keep=0.5
                 leaves E/2 experts in every layer.
  quantizer      a weight on a b-bit grid (each group of group_size rows and one
                 column: integers 0..2^b - 1, both ends present, times a step of
                 2^-4) is reproduced exactly at b bits; at 8 bits, with isotropic
                 calibration inputs (X^T X = n I: no error to trade between weights),
                 each weight is within half a step of the uniform grid over its
                 group's range [min(w, 0), max(w, 0)].
  decomposition  a stack of multilinear rank (2, 2, 2) (every expert of rank 2) is
                 reproduced within 1e-5 at the dense budget; the arrays it stores
                 never hold more than min(budget, E d_in d_out) numbers (budgets
                 below, at and above the dense size), and it counts them right.

Each check raises AssertionError naming the part and what broke
(test_posttrain_parts_contract.py runs them over the registries,
test_wrong_parts_fail.py shows a broken part fails them). Calibration data are
synthetic: the checks run in seconds, without a forward pass.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.posttrain import methods, prune
from moejax.posttrain.contributions import LayerStatistics

GROUP = 8  # quantizer group size: input rows per group
GRID_STEP = 2.0**-4


def fail(what: str, name: str, message: str) -> AssertionError:
  return AssertionError(f"{what} {name}: {message}")


def check_settings(what: str, name: str, method) -> None:
  """Defaults bind as declared; an unknown key or a value of another type is refused."""
  if method.bind().settings != method.defaults:
    raise fail(what, name, f"bind() gives {method.bind().settings}, not {method.defaults}")
  for key, bad in [("nonsense", 1)] + [(k, object()) for k in method.defaults]:
    try:
      method.bind(**{key: bad})
    except ConfigError as e:
      if f"--{key}=" not in str(e) or "\n" in str(e):
        raise fail(what, name, f"refused {key}={bad!r} without naming --{key}: {e}") from None
    else:
      raise fail(what, name, f"accepted the setting {key}={bad!r}")


def checked_method(what: str, registry, name: str, kinds: tuple[str, ...]):
  """The method registered as `name`, its settings checked, of a kind with a contract."""
  method = registry.get(name)
  check_settings(what, name, method)
  if method.kind not in kinds:
    raise fail(what, name, f"kind {method.kind!r} has no contract (kinds: {', '.join(kinds)})")
  return method


# ---- pruners


@functools.lru_cache(maxsize=1)
def random_tiny_lm():
  """(model config, params, rest): the tiny MoE LM (8 experts, top-2, 2 MoE blocks),
  pure-dict numpy arrays of random values (no forward pass is run)."""
  from moejax.configs import lm_shakespeare_moe
  from moejax.models.decoder import abstract_model

  m = lm_shakespeare_moe.get_config("size=tiny").model
  _, params, rest = abstract_model(m)
  rng = np.random.default_rng(0)

  def fill(tree, draw):
    if isinstance(tree, dict):
      return {k: fill(v, draw) for k, v in tree.items()}
    return draw(tree.shape).astype(tree.dtype)

  return m, fill(params, rng.standard_normal), fill(rest, lambda shape: np.zeros(shape))


class Calibration:
  """A prune.prune_model calibration of synthetic statistics for `m`'s MoE blocks:
  stats without step_score (with_step_scores adds it), and atom sums."""

  def __init__(self, m, seed: int = 0):
    from moejax.models.structure import expert_counts, moe_layer_indices

    rng = np.random.default_rng(seed)
    self.blocks = list(zip(moe_layer_indices(m), expert_counts(m)))
    self.stats = []
    for block, e in self.blocks:
      z, o = rng.standard_normal((e, 40)), rng.standard_normal((e, 40))
      self.stats.append(
        LayerStatistics(
          block, z @ z.T, rng.integers(1, 50, e).astype(float), rng.random(e), 64, None, o @ o.T
        )
      )
    f = m.moe.expert_d_ff
    self.atom_sums = {
      block: {
        **{k: rng.random((e, f)) for k in ("h2", "p2", "h2p2")},
        "hp": rng.standard_normal((e, f)),
        "count": rng.integers(1, 50, e).astype(float),
        "predicted": 256.0,
      }
      for block, e in self.blocks
    }
    self._step = [rng.standard_normal(e) for _, e in self.blocks]

  def with_step_scores(self):
    for layer, score in zip(self.stats, self._step):
      layer.step_score = score
    return self.stats


def check_selection(name: str, bound, stats) -> None:
  e = len(stats.gram)
  for m in range(1, e + 1):
    kept = bound(stats, m)
    ids = [int(k) for k in kept]
    if len(ids) != m or len(set(ids)) != m:
      raise fail("pruner", name, f"kept {list(kept)} for m={m}: not {m} distinct experts")
    if not all(0 <= k < e for k in ids):
      raise fail("pruner", name, f"kept {ids} for m={m}: an expert outside [0, {e})")
    if ids != sorted(ids) or tuple(bound(stats, m)) != tuple(kept):
      raise fail("pruner", name, f"kept {ids} for m={m}: not sorted, or not the same twice")


def check_scores(name: str, bound, sums, params) -> None:
  scores = bound(sums, params=params)
  if set(scores) != set(sums):
    raise fail("pruner", name, f"scores blocks {sorted(scores)}, not {sorted(sums)}")
  for block, s in scores.items():
    shape = np.shape(sums[block]["h2"])
    if np.shape(s) != shape or not np.all(np.isfinite(s)):
      raise fail(
        "pruner", name, f"block {block}: scores of shape {np.shape(s)}, not finite {shape}"
      )


def check_pruner(name: str) -> None:
  """The pruner registered as `name` against the module doc's contract."""
  from moejax.models.structure import expert_counts

  method = checked_method("pruner", methods.PRUNERS, name, ("expert", "atom"))
  m, params, rest = random_tiny_lm()
  calibration = Calibration(m)
  bound = method.bind()
  if method.kind == "expert":
    stats = calibration.with_step_scores() if "step_score" in method.needs else calibration.stats
    for layer in stats:
      check_selection(name, bound, layer)
  else:
    check_scores(name, bound, calibration.atom_sums, params)
  new_m, new_params, new_rest, _ = prune.prune_model(
    m, params, rest, keep="1.0", method=name, calibration=Calibration(m)
  )
  if expert_counts(new_m) != expert_counts(m) or new_m.moe.expert_d_ff != m.moe.expert_d_ff:
    raise fail("pruner", name, f"keep=1.0 changed the model config to {new_m.moe}")
  before, after = dict(leaves(params) + leaves(rest)), dict(leaves(new_params) + leaves(new_rest))
  if set(before) != set(after):
    raise fail("pruner", name, f"keep=1.0 changed the parameters {set(before) ^ set(after)}")
  for path, value in before.items():
    if np.shape(value) != np.shape(after[path]) or not np.array_equal(value, after[path]):
      raise fail("pruner", name, f"keep=1.0 changed parameter {path}")
  if method.kind == "expert":
    half, *_ = prune.prune_model(
      m, params, rest, keep="0.5", method=name, calibration=Calibration(m)
    )
    want = [e // 2 for e in expert_counts(m)]
    if expert_counts(half) != want:
      raise fail("pruner", name, f"keep=0.5 left {expert_counts(half)} experts, not {want}")


def leaves(tree, path=()) -> list:
  if isinstance(tree, dict):
    return [x for k in sorted(tree, key=str) for x in leaves(tree[k], path + (k,))]
  return [("/".join(map(str, path)), np.asarray(tree))]


# ---- quantizers


def grid_weight(rng, shape, bits: int) -> np.ndarray:
  """W [E, d_in, d_out] on every group's b-bit grid (module doc)."""
  top = 2**bits - 1
  codes = rng.integers(0, top + 1, shape)
  codes[:, 0::GROUP], codes[:, 1::GROUP] = 0, top  # both ends in each group and column
  return ((codes - (2 ** (bits - 1) - 1)) * GRID_STEP).astype(np.float32)


def half_steps(w, w_hat, bits: int, per_column: bool) -> float:
  """The largest |w - w_hat| over half the step of its group's uniform grid."""
  e, d_in, d_out = w.shape
  groups = w.reshape(e, d_in // GROUP, GROUP, d_out)
  axes = (2,) if per_column else (2, 3)
  low = np.minimum(groups.min(axis=axes, keepdims=True), 0)
  high = np.maximum(groups.max(axis=axes, keepdims=True), 0)
  step = (high - low) / (2**bits - 1)
  error = np.abs(groups - np.asarray(w_hat).reshape(groups.shape))
  return float(np.max(error / (step / 2)))


def quantized(name: str, method, w, bits: int, hessians) -> np.ndarray:
  out = method.bind()(w, bits, GROUP, hessians if "hessians" in method.needs else None)
  if len(out) != len(w):
    raise fail("quantizer", name, f"{len(out)} results for {len(w)} experts")
  w_hat = np.stack([q.dequantize() for q in out])
  if w_hat.shape != w.shape or w_hat.dtype != np.float32:
    raise fail("quantizer", name, f"dequantized {w_hat.shape} {w_hat.dtype}, not {w.shape} float32")
  return w_hat


def check_quantizer(name: str) -> None:
  """The quantizer registered as `name` against the module doc's contract."""
  method = checked_method("quantizer", methods.QUANTIZERS, name, ("integer", "codebook"))
  rng = np.random.default_rng(1)
  shape = (3, 2 * GROUP, GROUP)
  x = rng.standard_normal((3, 64, shape[1]))
  correlated = np.einsum("eni,enj->eij", x, x)
  for bits in (2, 4, 8):
    w = grid_weight(rng, shape, bits)
    w_hat = quantized(name, method, w, bits, correlated)
    if not np.array_equal(w_hat, w):
      worst = float(np.max(np.abs(w_hat - w)))
      raise fail("quantizer", name, f"a weight on the {bits}-bit grid moved by up to {worst:g}")
  w = rng.standard_normal(shape).astype(np.float32)
  isotropic = np.broadcast_to(64.0 * np.eye(shape[1]), (3, shape[1], shape[1]))
  worst = half_steps(w, quantized(name, method, w, 8, isotropic), 8, method.kind == "integer")
  if worst > 1 + 1e-3:  # float32 scales and products: a few 1e-5 of a half step
    raise fail("quantizer", name, f"at 8 bits an error of {worst:.4g} half steps (over 1)")


# ---- decompositions


def check_decomposition(name: str) -> None:
  """The decomposition registered as `name` against the module doc's contract."""
  method = checked_method("decomposition", methods.DECOMPOSITIONS, name, ("joint", "per_expert"))
  rng = np.random.default_rng(2)
  e, d_in, d_out = shape = (4, 8, 6)
  dense = e * d_in * d_out
  data = {"inputs": rng.standard_normal((64, d_in)), "outputs": rng.standard_normal((64, d_out))}
  given = {k: (v if k in method.needs else None) for k, v in data.items()}
  decompose = method.bind()
  core = rng.standard_normal((2, 2, 2))
  u = [rng.standard_normal((n, 2)) for n in shape]
  low = np.einsum("abc,ea,ib,oc->eio", core, *u)
  w_hat = np.asarray(decompose(low, dense, **given).reconstruct())
  error = float(np.max(np.abs(w_hat - low))) / float(np.max(np.abs(low)))
  if w_hat.shape != shape or not error <= 1e-5:
    raise fail(
      "decomposition", name, f"a rank-(2, 2, 2) stack came back {w_hat.shape}, error {error:.3g}"
    )
  full = rng.standard_normal(shape)
  for budget in (dense // 2, dense, 4 * dense):
    model = decompose(full, budget, **given)
    stored = sum(np.size(v) for v in vars(model).values() if isinstance(v, np.ndarray))
    if stored != model.parameters or stored > min(budget, dense):
      raise fail(
        "decomposition",
        name,
        f"budget {budget} (dense {dense}): stores {stored} numbers, counts {model.parameters}",
      )


# ---- every registry, for the tests

REGISTRIES = {
  "pruner": (methods.PRUNERS, check_pruner),
  "quantizer": (methods.QUANTIZERS, check_quantizer),
  "decomposition": (methods.DECOMPOSITIONS, check_decomposition),
}


def every_method() -> list:
  """pytest params (kind, name) of every registered post-training method."""
  return [
    pytest.param(kind, name, id=f"{kind}-{name}")
    for kind, (registry, _) in REGISTRIES.items()
    for name in registry
  ]


def check(kind: str, name: str) -> None:
  REGISTRIES[kind][1](name)
