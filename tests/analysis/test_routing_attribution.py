"""Routing attribution (moejax/analysis/routing_attribution.py): every component of
the residual stream, per attention head and per expert, sums to the router's own
logits; a component that writes nothing has zero influence."""

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.configs import lm_shakespeare_moe
from moejax.analysis import routing_attribution as ra
from moejax.errors import ConfigError
from moejax.train.loop import init_state

from tests.analysis.attribution_model import TOKENS, model


def test_contributions_sum_to_the_router_logits():
  graphdef, params, rest = model()
  layers = ra.attribute(graphdef, params, rest, TOKENS)
  assert [layer["block"] for layer in layers] == [1, 2]
  for layer in layers:
    total = layer["contributions"].sum(axis=0)
    scale = np.abs(layer["logits"]).max()
    np.testing.assert_allclose(total, layer["logits"], rtol=0, atol=1e-5 * scale)
  names = layers[1]["names"]
  assert names[0] == "embed" and "attn0.head1" in names and "attn2.bias" in names
  assert "ffn0" in names and "moe1.expert7" in names and "moe1.shared" in names
  sources = ra.influence_by_source(layers[1])
  assert set(sources) == {"embed", "attn0", "ffn0", "attn1", "moe1", "attn2"}


def test_a_head_that_writes_nothing_has_zero_influence():
  graphdef, params, rest = model()
  w_o = np.array(params["blocks"][0]["attn"]["o"]["kernel"])
  head_dim = w_o.shape[0] // 2  # tiny: 2 heads
  w_o[head_dim:] = 0.0  # head 1 of block 0 writes nothing
  params["blocks"][0]["attn"]["o"]["kernel"] = jnp.asarray(w_o)
  layer = ra.attribute(graphdef, params, rest, TOKENS)[0]
  influence = dict(zip(layer["names"], layer["influence"]))
  assert influence["attn0.head1"] == 0.0 and influence["attn0.head0"] > 0.0


def test_a_scanned_model_is_refused():
  c = lm_shakespeare_moe.get_config("size=tiny")
  c.model.scan_layers = True
  graphdef, state, _ = init_state(c)
  with pytest.raises(ConfigError, match="loop layout"):
    ra.attribute(graphdef, state.params, state.rest, TOKENS)


def test_signed_effects_by_hand():
  """C=2 components, T=2 tokens, E=3 experts, top-1. Centred over experts:
  component 0: t0 [1, 2, 3] -> [-1, 0, 1], t1 [0, 0, 3] -> [-1, -1, 2];
  component 1: t0 [2, 0, 1] -> [1, -1, 0], t1 [0, 3, 0] -> [-1, 2, -1].
  Logits (the sum): t0 [3, 2, 4] chooses expert 2, t1 [0, 3, 3] expert 1 (the first)."""
  layer = {
    "contributions": np.array([[[1, 2, 3], [0, 0, 3]], [[2, 0, 1], [0, 3, 0]]], float),
    "logits": np.array([[3, 2, 4], [0, 3, 3]], float),
    "top_k": 1,
  }
  out = ra.signed_effects(layer)
  np.testing.assert_allclose(out["per_expert"], [[-1, -0.5, 1.5], [0, 0.5, -0.5]])
  np.testing.assert_allclose(out["on_chosen"], [(1 + -1) / 2, (0 + 2) / 2])
  shifted = dict(layer, contributions=layer["contributions"] + 7.0)  # a common shift
  np.testing.assert_allclose(ra.signed_effects(shifted)["per_expert"], out["per_expert"])


def test_an_ablated_component_contributes_nothing_and_flip_rate_by_hand():
  from flax import nnx

  graphdef, params, rest = model()
  m = nnx.merge(graphdef, params, rest).cfg
  before = ra.attribute(graphdef, params, rest, TOKENS)[-1]
  for name in ("attn0.head1", "moe1.expert3"):
    layer = ra.attribute(graphdef, ra.ablate_component(m, params, name), rest, TOKENS)[-1]
    index = layer["names"].index(name)
    assert np.any(before["contributions"][index] != 0.0)
    assert np.all(layer["contributions"][index] == 0.0)
  with pytest.raises(ValueError, match="cannot ablate component 'embed'"):
    ra.ablate_component(m, params, "embed")
  sets = np.array([[1, 0, 1], [0, 1, 1]], bool)
  assert ra.flip_rate(sets, sets) == 0.0
  assert ra.flip_rate(sets, np.array([[1, 0, 1], [1, 1, 0]], bool)) == 0.5


def test_signed_effects_default_to_top_1_and_read_each_tokens_own_top_2():
  """Without a recorded top_k a layer is read as top-1 (the hand case above); with
  top_k = 2 on 3 tokens and 4 experts (asymmetric, ties broken to the lower index),
  on_chosen averages u over each token's own two largest logits."""
  layer = {
    "contributions": np.array([[[1, 2, 3], [0, 0, 3]], [[2, 0, 1], [0, 3, 0]]], float),
    "logits": np.array([[3, 2, 4], [0, 3, 3]], float),
  }
  np.testing.assert_allclose(ra.signed_effects(layer)["on_chosen"], [0.0, 1.0])
  contributions = np.arange(12.0).reshape(1, 3, 4) ** 2  # one component, T=3, E=4
  logits = np.array([[0.0, 5.0, 1.0, 4.0], [2.0, 2.0, 2.0, 0.0], [9.0, 0.0, 0.0, 8.0]])
  centred = contributions[0] - contributions[0].mean(-1, keepdims=True)
  chosen = [(1, 3), (0, 1), (0, 3)]
  want = np.mean([centred[t, e] for t, pair in enumerate(chosen) for e in pair])
  out = ra.signed_effects({"contributions": contributions, "logits": logits, "top_k": 2})
  np.testing.assert_allclose(out["on_chosen"], [want])


def test_ablation_zeroes_exactly_one_heads_rows_of_w_o_or_one_experts_w_down():
  """4 heads of 3 value dims each (W_o [12, 5]) and 3 experts: attn0.head2 zeroes
  rows 6..8 and nothing else, moe0.expert1 zeroes w_down[1] and nothing else; the
  given params are not changed."""
  import types

  kernel = jnp.arange(1.0, 61.0).reshape(12, 5)
  w_down = jnp.arange(1.0, 1 + 3 * 2 * 5).reshape(3, 2, 5)
  params = {
    "blocks": {0: {"attn": {"o": {"kernel": kernel}}, "ffn": {"experts": {"w_down": w_down}}}}
  }
  cfg = types.SimpleNamespace(num_heads=4)
  out = ra.ablate_component(cfg, params, "attn0.head2")["blocks"][0]["attn"]["o"]["kernel"]
  want = np.asarray(kernel).copy()
  want[6:9] = 0.0
  np.testing.assert_array_equal(out, want)
  out = ra.ablate_component(cfg, params, "moe0.expert1")["blocks"][0]["ffn"]["experts"]["w_down"]
  want = np.asarray(w_down).copy()
  want[1] = 0.0
  np.testing.assert_array_equal(out, want)
  np.testing.assert_array_equal(params["blocks"][0]["attn"]["o"]["kernel"], kernel)
