"""Merged-expert MoE layers (model.moe.merge: smear, ep_camex; namex's propagation step;
namex in the decoder: tests/layers/test_namex.py):
numpy oracles for the merge rules and the segment gates, causality across segments,
finite-difference gradients, the Nash-weight twin against moejax.merging.nash, and
one-line refusals of configs the merge cannot run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

from moejax.config import base_config
from moejax.errors import ConfigError
from moejax.experts import merged
from moejax.experts.swiglu import swiglu_expert
from moejax.layers.moe import MoELayer
from moejax.merging.nash import nash_weights
from moejax.validation import validate_config
from tests.helpers import moe_cfg

D, F, E = 6, 5, 3
NAMES = ("w_gate", "w_up", "w_down")


def np_swiglu(w, x):
  gate = x @ w["w_gate"]
  return (gate / (1 + np.exp(-gate)) * (x @ w["w_up"])) @ w["w_down"]


def random_weights(seed, leading=(E,)):
  rng = np.random.default_rng(seed)
  shapes = {"w_gate": (D, F), "w_up": (D, F), "w_down": (F, D)}
  return {k: rng.standard_normal(leading + s) / np.sqrt(s[0]) for k, s in shapes.items()}


def layer_of(merge, seed=0, **settings):
  cfg = moe_cfg(
    num_experts=E,
    expert_d_ff=F,
    merge=merge,
    loss_weights={},
    merged={"segment_len": 4, **settings},
  )
  return MoELayer(D, cfg, rngs=nnx.Rngs(seed), dtype=jnp.float64)


def params_of(layer):
  """The layer's router kernel, expert and base weights as float64 numpy."""
  experts = {k: np.asarray(v, np.float64) for k, v in layer.experts.weights(jnp.float64).items()}
  base = (
    None
    if layer.merge_base is None
    else {k: np.asarray(v[0], np.float64) for k, v in layer.merge_base.weights(jnp.float64).items()}
  )
  return np.asarray(layer.router_kernel[...], np.float64), experts, base


def np_layer(x, kernel, experts, base, rule, segment_len, eta=1.0, mask=None):
  """The merged layer by hand: per row and segment, the previous segment's softmax
  gates (uniform for the first), merged weights, one SwiGLU."""
  b, length, _ = x.shape
  mask = np.ones((b, length)) if mask is None else mask.astype(np.float64)
  y = np.zeros_like(x)
  for row in range(b):
    gates = np.full(E, 1.0 / E)
    for start in range(0, length, segment_len):
      seg = slice(start, start + segment_len)
      if rule == "smear":
        w = {k: np.einsum("e,e...->...", gates, experts[k]) for k in NAMES}
      else:
        w = {
          k: base[k] + eta * np.einsum("e,e...->...", gates, experts[k] - base[k]) for k in NAMES
        }
      y[row, seg] = np_swiglu(w, x[row, seg])
      m = mask[row, seg][:, None]
      logits = (np.sum(x[row, seg] * m, 0) / max(m.sum(), 1.0)) @ kernel
      gates = np.exp(logits - logits.max()) / np.sum(np.exp(logits - logits.max()))
  return y


@pytest.mark.parametrize("expert", range(E))
def test_smear_with_one_hot_gates_is_that_expert_alone(expert):
  weights = random_weights(1)
  x = np.random.default_rng(2).standard_normal((2, 7, D))
  gates = np.zeros((2, 2, E))
  gates[..., expert] = 1.0
  with jax.enable_x64(True):
    y = merged.merged_forward(
      jnp.asarray(x),
      jnp.asarray(gates),
      swiglu_expert,
      weights,
      None,
      merged.MERGE_RULES.get("smear"),
      4,
      1.0,
    )
  alone = np_swiglu({k: w[expert] for k, w in weights.items()}, x)
  np.testing.assert_allclose(np.asarray(y), alone, rtol=1e-12, atol=1e-12)


def test_smear_with_one_segment_is_the_numpy_merge_then_swiglu():
  weights = random_weights(3)
  rng = np.random.default_rng(4)
  x = rng.standard_normal((2, 5, D))
  gates = rng.dirichlet(np.ones(E), size=(2, 1))
  with jax.enable_x64(True):
    y = merged.merged_forward(
      jnp.asarray(x),
      jnp.asarray(gates),
      swiglu_expert,
      weights,
      None,
      merged.MERGE_RULES.get("smear"),
      5,
      1.0,
    )
  for row in range(2):
    w = {k: sum(gates[row, 0, i] * weights[k][i] for i in range(E)) for k in NAMES}
    np.testing.assert_allclose(np.asarray(y[row]), np_swiglu(w, x[row]), rtol=1e-12, atol=1e-12)


def test_ep_camex_with_identity_curvature_is_base_plus_gated_task_vectors():
  weights, base = random_weights(5), random_weights(6, leading=())
  gates = np.random.default_rng(7).dirichlet(np.ones(E), size=(2, 3))
  got = merged.ep_camex(weights, base, jnp.asarray(gates), 0.7)
  for k in NAMES:
    want = base[k] + 0.7 * sum(
      gates[..., i, None, None] * (weights[k][i] - base[k]) for i in range(E)
    )
    np.testing.assert_allclose(np.asarray(got[k]), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rule,eta", [("smear", 1.0), ("ep_camex", 0.6)])
def test_layer_equals_the_hand_computed_segment_merge(rule, eta):
  """Through MoELayer: masked segment means, softmax gates of the previous segment,
  a short last segment (length 10, segments of 4)."""
  with jax.enable_x64(True):
    layer = layer_of(rule, eta=eta)
    x = np.random.default_rng(8).standard_normal((2, 10, D))
    mask = np.ones((2, 10), bool)
    mask[1, :3] = False  # left padding
    y, aux = layer(jnp.asarray(x), token_mask=jnp.asarray(mask))
    want = np_layer(x, *params_of(layer), rule, 4, eta, mask)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-10, atol=1e-10)
    assert float(aux["aux_loss"]) == 0.0
    np.testing.assert_allclose(np.sum(aux["metrics"]["load_fraction"]), 1.0, rtol=1e-12)


def test_ep_camex_with_eta_zero_is_the_base_expert():
  with jax.enable_x64(True):
    layer = layer_of("ep_camex", eta=0.0)
    x = np.random.default_rng(9).standard_normal((2, 9, D))
    y, _ = layer(jnp.asarray(x))
    _, _, base = params_of(layer)
  np.testing.assert_allclose(np.asarray(y), np_swiglu(base, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rule", ["smear", "ep_camex"])
def test_changing_segment_s_plus_one_leaves_segments_up_to_s_unchanged(rule):
  with jax.enable_x64(True):
    layer = layer_of(rule)
    x = np.random.default_rng(10).standard_normal((1, 12, D))
    changed = x.copy()
    changed[:, 4:8] += 3.0  # segment 1 of [0:4], [4:8], [8:12]
    y, _ = layer(jnp.asarray(x))
    y_changed, _ = layer(jnp.asarray(changed))
  np.testing.assert_array_equal(np.asarray(y)[:, :4], np.asarray(y_changed)[:, :4])
  # segment 2 merges with segment 1's gates: it must move (the check is not vacuous)
  assert np.max(np.abs(np.asarray(y - y_changed)[:, 8:])) > 1e-6


@pytest.mark.parametrize("rule", ["smear", "ep_camex"])
def test_gradients_to_router_and_experts_match_finite_differences(rule):
  with jax.enable_x64(True):
    layer = layer_of(rule, eta=0.8)
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
    params = jax.tree.map(lambda p: p.astype(jnp.float64), nnx.to_pure_dict(params))
    rest = nnx.to_pure_dict(rest)
    x = jax.random.normal(jax.random.key(1), (2, 9, D), jnp.float64)
    proj = jax.random.normal(jax.random.key(2), (2, 9, D), jnp.float64)

    @jax.jit
    def loss(params):
      y, _ = nnx.merge(graphdef, params, rest)(x)
      return jnp.sum(y * proj)

    check_grads(loss, (params,), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)
    grads = jax.grad(loss)(params)
    assert float(jnp.max(jnp.abs(grads["router_kernel"]))) > 1e-4  # gates get a gradient
    assert float(jnp.max(jnp.abs(grads["experts"]["w_down"]))) > 1e-4


def test_nash_weights_twin_equals_nash_weights():
  rng = np.random.default_rng(11)
  with jax.enable_x64(True):
    for n in (1, 2, 4, 6):
      g = rng.standard_normal((20, n)) + 0.3  # correlated task vectors
      gram = g.T @ g
      np.testing.assert_allclose(
        np.asarray(merged.nash_weights_jnp(jnp.asarray(gram))), nash_weights(gram), rtol=1e-9
      )


def test_namex_propagation_is_the_hand_formula_with_nash_weights():
  weights, base = random_weights(12), random_weights(13, leading=())
  taus = {k: weights[k] - base[k] for k in NAMES}
  g = np.stack([np.concatenate([taus[k][i].ravel() for k in NAMES]) for i in range(E)], 1)
  alpha = nash_weights(g.T @ g)
  with jax.enable_x64(True):
    got = merged.propagate(merged.initial_carry(base), weights, 0.5, 0j)["base"]
  for k in NAMES:
    want = base[k] + 0.5 * np.einsum("e,e...->...", alpha, taus[k])
    np.testing.assert_allclose(np.asarray(got[k]), want, rtol=1e-9, atol=1e-12)
  # the bargaining property: the step improves every expert's utility equally (1 / alpha)
  step = np.concatenate([(np.asarray(got[k]) - base[k]).ravel() for k in NAMES]) / 0.5
  np.testing.assert_allclose(step @ g, 1.0 / alpha, rtol=1e-8)


@pytest.mark.parametrize(
  "key,value,named",
  [
    ("experts", "atomic", "model.moe.experts='atomic'"),
    ("merged.segment_len", 0, "model.moe.merged.segment_len=0"),
    ("merged.eta", -1.0, "model.moe.merged.eta=-1.0"),
    ("merge", "soup", "model.moe.merge='soup'"),
    ("router", "sigmoid_bias", "model.moe.router='sigmoid_bias'"),
    ("shared.count", 1, "model.moe.shared.count=1"),
  ],
)
def test_configs_the_merge_cannot_run_are_refused_naming_the_key(key, value, named):
  c = base_config()
  e = c.model.moe
  e.merge, e.loss_weights = "smear", {}
  section, _, name = key.rpartition(".")
  (e[section] if section else e)[name] = value
  with pytest.raises(ConfigError) as error:
    validate_config(c)
  message = str(error.value)
  assert named in message and "\n" not in message


def test_the_default_and_a_merged_config_validate():
  c = base_config()
  validate_config(c)
  c.model.moe.merge, c.model.moe.loss_weights = "ep_camex", {}
  validate_config(c)


def test_kv_cache_decoding_of_merged_experts_is_refused_naming_the_key():
  from moejax.inference.generate import generation_config

  c = base_config()
  c.model.moe.merge, c.model.moe.loss_weights = "smear", {}
  with pytest.raises(ConfigError, match=r"^model\.moe\.merge='smear': merged experts route by"):
    generation_config(c.model)
  generation_config(base_config().model)  # the default decodes
