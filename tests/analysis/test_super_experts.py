"""Super experts, massive activations and attention sinks (moejax/analysis/super_experts.py)
on a randomly initialised tiny LM, against brute force and planted structure."""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.analysis import super_experts as se
from moejax.errors import ConfigError
from moejax.layers.rope import apply_rope, rope_frequencies
from moejax.models.decoder import stack_layers
from moejax.train.loop import init_state

from tests.analysis.super_expert_model import SINK_TOKEN, captured, copy, swiglu_numpy

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_thresholds_on_hand_made_peaks():
  a = np.arange(1.0, 201.0).reshape(2, 100)  # 1..200; max 200, so 0.1 * max = 20
  # quantile binding: P99.5 = 1 + 0.995 * 199 = 199.005, P95 = 190.05
  assert se.super_experts(a) == [(1, 99)]
  assert se.super_experts(a, quantile=95.0) == [(1, e) for e in range(90, 100)]
  # fraction binding: P50 = 100.5 < 0.6 * 200 = 120
  assert se.super_experts(a, quantile=50.0, fraction_of_max=0.6) == [(1, e) for e in range(20, 100)]
  # the layer filter drops rows; the thresholds still come from all of A
  b = np.ones((3, 8))
  b[0, 2], b[2, 5], b[1, 1] = 1000.0, 150.0, 99.0
  assert se.super_experts(b, quantile=50.0) == [(0, 2), (2, 5)]  # 99 < 0.1 * 1000
  assert se.super_experts(b, quantile=50.0, layers=[1, 2]) == [(2, 5)]
  assert se.super_experts(b, quantile=50.0, layers=[]) == []
  b[1, 7] = np.nan  # padding of a layer with fewer experts is ignored
  assert se.super_experts(b, quantile=50.0) == [(0, 2), (2, 5)]
  assert se.massive_layers(
    {"max": [5.0, 400.0, 410.0, 900.0], "embedding_max": 3.0, "ratio": [6.0, 300.0, 310.0, 700.0]}
  ) == [1, 3]


def test_the_official_rule_and_the_massive_layers_guess_disagree_by_hand():
  """4 MoE blocks x 8 experts. The official rule keeps blocks < round(0.75 * 4) = 3 and
  takes its thresholds there: P99.5 of those 24 a = 40 + 0.885 * (50 - 40) = 48.85,
  50 // 10 = 5, so (1, 2) alone. The guess keeps block 3 (the only massive layer) with
  thresholds over all 32 a: P99.5 = 50 + 0.845 * (1000 - 50) = 852.75, 0.1 * 1000 = 100,
  so (3, 5) alone."""
  a = np.full((4, 8), 2.0)
  a[1, 2], a[0, 0], a[3, 5] = 50.0, 40.0, 1000.0
  massive = {
    "max": np.array([3.0, 4.0, 5.0, 900.0]),
    "embedding_max": 2.0,
    "ratio": np.array([5.0, 6.0, 7.0, 500.0]),
  }
  blocks = [0, 1, 2, 3]
  assert se.official_layers(blocks, 4) == [0, 1, 2]
  assert se.select("official", a, massive, blocks, 4) == [(1, 2)]
  assert se.select("massive_layers", a, massive, blocks, 4) == [(3, 5)]
  # round half to even as the official run.py: 6 layers keep 4, 10 keep 8; first_dense=1
  assert se.official_layers(range(6), 6) == [0, 1, 2, 3]
  assert se.official_layers(range(10), 10) == list(range(8))
  assert se.official_layers([1, 2, 3, 4, 5], 6) == [0, 1, 2]
  # floor division: max 19 gives 19 // 10 = 1 (not 1.9), so a = 1.5 passes at P0 = 1.0
  assert se.super_experts([[19.0, 1.5, 1.0]], quantile=0.0, layers=[0], within=True) == [
    (0, 0),
    (0, 1),
  ]
  assert se.super_experts([[19.0, 1.5, 1.0]], quantile=0.0) == [(0, 0)]
  with pytest.raises(ConfigError, match="rule='x' must be one of official, massive_layers"):
    se.select("x", a, massive, blocks, 4)


def test_the_official_rule_names_block_3_expert_6_on_the_committed_zoo_s_profile():
  """docs/results/phenomena_zoo_s.json (6 MoE blocks x 16 experts): blocks 0-3 kept,
  their P99.5 is 19.21 and a[3, 6] = 20.0 the only one above it; the massive-layers
  guess named none there (no massive layer)."""
  report = json.loads((ROOT / "docs/results/phenomena_zoo_s.json").read_text())
  peaks = np.asarray(report["expert_output_peaks"], np.float64)
  massive = {
    key: np.array([layer[key] for layer in report["massive_activations"]["layers"]])
    for key in ("max", "ratio")
  }
  massive["embedding_max"] = report["massive_activations"]["embedding_max"]
  blocks = report["moe_blocks"]
  assert se.select("official", peaks, massive, blocks, len(blocks)) == [(3, 6)]
  assert se.select("massive_layers", peaks, massive, blocks, len(blocks)) == []
  assert report["super_experts"] == []  # what the guess committed


def test_peaks_equal_a_brute_force_loop_over_routed_tokens(sink_lm):
  config, graphdef, params, rest, tokens = sink_lm
  peaks = np.asarray(se.expert_output_peaks(graphdef, params, rest, tokens))
  values, routing = jax.device_get(captured(graphdef, params, rest, tokens))
  expected = np.zeros_like(peaks)
  for layer, (x, (index, valid)) in enumerate(zip(values["x"], routing)):
    w = {k: np.asarray(v, np.float64) for k, v in params["blocks"][layer]["ffn"]["experts"].items()}
    for t, row in enumerate(np.asarray(x, np.float64).reshape(-1, x.shape[-1])):
      for s in range(index.shape[1]):
        if valid[t, s]:
          e = index[t, s]
          expected[layer, e] = max(expected[layer, e], np.abs(swiglu_numpy(w, e, row)).max())
  assert peaks.shape == (config.model.num_layers, config.model.moe.num_experts)
  assert np.all(expected > 0)  # every expert got tokens: the loop checks each one
  np.testing.assert_allclose(peaks, expected, rtol=1e-5)


def test_a_planted_super_expert_is_found_exactly(sink_lm):
  config, graphdef, params, rest, tokens = sink_lm
  plain = se.profile((config, params, rest), tokens, rule="massive_layers")
  assert plain["super_experts"] == []
  assert plain["massive_activations"]["massive_layers"] == []
  # the official rule has no layer filter but the first 75% of blocks: the largest a
  # there passes both thresholds even on an untrained model
  first = np.asarray(plain["expert_output_peaks"])[: round(0.75 * config.model.num_layers)]
  assert plain["super_experts_by_rule"]["official"] == [
    {"moe_layer": int(i), "block": int(i), "expert": int(e), "a": float(first[i, e])}
    for i, e in [np.unravel_index(np.argmax(first), first.shape)]
  ]
  peaks = np.asarray(se.expert_output_peaks(graphdef, params, rest, tokens))
  # Plant: expert e of layer 1, its down-projection column c (where its peak is) x100.
  layer, e = 1, int(np.argmax(peaks[1]))
  values, routing = jax.device_get(captured(graphdef, params, rest, tokens))
  index, valid = routing[layer]
  x = values["x"][layer].reshape(-1, config.model.d_model)[np.any(valid & (index == e), 1)]
  w = {k: v[e] for k, v in params["blocks"][layer]["ffn"]["experts"].items()}
  y = (jax.nn.silu(x @ w["w_gate"]) * (x @ w["w_up"])) @ w["w_down"]
  c = int(np.argmax(np.abs(np.asarray(y)).max(0)))
  planted = copy(params)
  down = planted["blocks"][layer]["ffn"]["experts"]["w_down"]
  planted["blocks"][layer]["ffn"]["experts"]["w_down"] = down.at[e, :, c].multiply(100.0)
  out = se.profile((config, planted, rest), tokens)
  assert [(p["moe_layer"], p["expert"]) for p in out["super_experts"]] == [(layer, e)]
  assert out["massive_activations"]["massive_layers"] == [1]  # formed in block 1
  assert out["massive_activations"]["layers"][1]["channel"] == c
  assert out["expert_output_peaks"][layer][e] == pytest.approx(100 * peaks[layer, e], rel=1e-4)
  assert se.super_experts(out["expert_output_peaks"]) == [(layer, e)]


@functools.partial(jax.jit, static_argnums=0)
def first_block_by_hand(graphdef, params, rest, tokens):
  """Block 0 called on the embedded tokens with a causal mask: its residual output."""
  model = nnx.merge(graphdef, params, rest)
  block, x = model.blocks[0], model.embed[...][tokens]
  positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
  causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))[None]
  h, _, _ = block(x, positions, causal, None, None, 0, train=False, rng=jax.random.key(0))
  return h


def brute_force_sink_mass(config, graphdef, params, rest, tokens) -> list[float]:
  """Probabilities by hand in numpy from the captured q and k projections."""
  m = config.model
  values, _ = captured(graphdef, params, rest, tokens)
  b, length = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(length), (b, length))
  inv_freq, factor = rope_frequencies(m.rope, m.head_dim)
  out = []
  for i in range(m.num_layers):
    q, k = (values[name][i].reshape(b, length, -1, m.head_dim) for name in ("q", "k"))
    q, k = (
      np.asarray(apply_rope(t, positions, inv_freq, factor, m.rope.interleave), np.float64)
      for t in (q, k)
    )
    group = m.num_heads // m.num_kv_heads
    scores = np.einsum("blhk,bshk->bhls", q, np.repeat(k, group, axis=2)) / np.sqrt(m.head_dim)
    scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out.append(probs[:, :, 1:, 0].mean())
  return out


def test_attention_sink_mass_by_hand_and_a_planted_sink(sink_lm):
  config, graphdef, params, rest, tokens = sink_lm
  m = config.model
  params = copy(params)
  rng = np.random.default_rng(1)
  for i in range(m.num_layers):  # nonzero biases, so they take part in the hand computation
    for name in ("q", "k"):
      bias = params["blocks"][i]["attn"][name]["bias"]
      params["blocks"][i]["attn"][name]["bias"] = jnp.asarray(
        rng.normal(size=bias.shape), jnp.float32
      )
  mass = np.asarray(se.attention_sink_mass(graphdef, params, rest, tokens))
  np.testing.assert_allclose(
    mass, brute_force_sink_mass(config, graphdef, params, rest, tokens), rtol=1e-5
  )
  assert mass[0] < 0.5
  # Plant a sink in layer 0: every query is c along dim j of its head, the one key
  # of SINK_TOKEN (embedding channel 0 only) is K along j, every other key is 0.
  # j is in the slowest RoPE pair, so a query at position p still scores about
  # c K cos(p * 1e-4) on key 0.
  j = m.head_dim - 2 if m.rope.interleave else m.head_dim // 2 - 1
  attn = params["blocks"][0]["attn"]
  attn["q"]["kernel"] = jnp.zeros_like(attn["q"]["kernel"])
  attn["q"]["bias"] = jnp.zeros_like(attn["q"]["bias"]).at[j :: m.head_dim].set(2.0)
  attn["k"]["bias"] = jnp.zeros_like(attn["k"]["bias"])
  attn["k"]["kernel"] = jnp.zeros_like(attn["k"]["kernel"]).at[0, j :: m.head_dim].set(4.0)
  embed = params["embed"].at[:, 0].set(0.0)
  params["embed"] = embed.at[SINK_TOKEN].set(jnp.zeros(m.d_model).at[0].set(1.0))
  planted = np.asarray(se.attention_sink_mass(graphdef, params, rest, tokens))
  # key 0 scores 2 * 4 * sqrt(d_model) / sqrt(head_dim) = 11.3, every other key 0
  assert planted[0] > 0.999
  np.testing.assert_allclose(
    planted, brute_force_sink_mass(config, graphdef, params, rest, tokens), rtol=1e-5
  )


def test_massive_activations_find_a_planted_outlier(sink_lm):
  config, graphdef, params, rest, tokens = sink_lm
  plain = jax.device_get(se.massive_activations(graphdef, params, rest, tokens))
  assert np.all(plain["ratio"] < 20)
  token = 7
  tokens = np.where(np.asarray(tokens) == token, token + 1, np.asarray(tokens))
  tokens[2, 5] = token
  params = copy(params)
  params["embed"] = params["embed"].at[token, 3].set(1000.0)
  out = jax.device_get(se.massive_activations(graphdef, params, rest, jnp.asarray(tokens)))
  for i in range(config.model.num_layers):
    assert (out["row"][i], out["position"][i], out["channel"][i]) == (2, 5, 3)
    assert out["max"][i] == pytest.approx(1000.0, rel=0.02)
    assert out["ratio"][i] == pytest.approx(out["max"][i] / out["median"][i], rel=1e-6)
    assert out["ratio"][i] > 500
  assert out["embedding_max"] == pytest.approx(1000.0)
  assert se.massive_layers(out) == []  # in the embedding already: formed by no block
  # block 0's output by hand: the residual after attention and the MoE layer
  h = first_block_by_hand(graphdef, params, rest, jnp.asarray(tokens))
  assert out["max"][0] == pytest.approx(float(jnp.max(jnp.abs(h))), rel=1e-6)
  assert out["median"][0] == pytest.approx(float(jnp.median(jnp.abs(h))), rel=1e-6)


def test_a_scanned_model_is_profiled_in_the_loop_layout(sink_lm):
  config, graphdef, params, rest, tokens = sink_lm
  scanned = config.copy_and_resolve_references()
  scanned.model.scan_layers = True
  scanned_graphdef = init_state(scanned)[0]
  _, scanned_params, scanned_rest = stack_layers(config.model, params, rest)  # the loop's
  assert "block" in scanned_params["blocks"]
  assert se.profile((scanned, scanned_params, scanned_rest), tokens) == se.profile(
    (config, params, rest), tokens
  )
  from moejax.errors import ConfigError

  with pytest.raises(ConfigError, match="unstack_layers"):
    se.measure(scanned_graphdef, scanned_params, scanned_rest, tokens)


def test_massive_layer_defaults_at_their_boundaries():
  """The defaults min_ratio = 100 and growth = 2 are inclusive (>=): a block at ratio
  exactly 100 with a max exactly twice the stream entering it forms massive
  activations; 99.99 or 1.999-fold does not. Each block's 'before' is the previous
  block's max (the embedding's for block 0)."""
  massive = {
    "embedding_max": 4.0,
    "max": np.array([8.0, 16.0, 31.99, 63.98, 127.96]),
    "ratio": np.array([100.0, 99.99, 500.0, 100.0, 1e4]),
  }
  # block 0: 8 = 2 * 4, ratio 100 (in); 1: ratio 99.99 (out); 2: 31.99 < 2 * 16 (out);
  # 3: 63.98 = 2 * 31.99 (in); 4: 127.96 = 2 * 63.98 (in)
  assert se.massive_layers(massive) == [0, 3, 4]
  assert se.massive_layers(massive, min_ratio=99.99) == [0, 1, 3, 4]
  assert se.massive_layers(massive, growth=1.9) == [0, 2, 3, 4]  # 31.99 >= 1.9 * 16


def test_uniform_sink_mass_by_hand():
  """Uniform causal attention: query q (q = 1..L-1) puts 1 / (q + 1) on key 0;
  L = 4: mean(1/2, 1/3, 1/4) = 13/36. One position has no query after it."""
  assert se.uniform_sink_mass(4) == pytest.approx(13 / 36)
  assert se.uniform_sink_mass(2) == pytest.approx(0.5)
  assert np.isnan(se.uniform_sink_mass(1))
