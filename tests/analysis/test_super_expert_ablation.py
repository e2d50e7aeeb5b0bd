"""Super-expert ablation (Su et al., arXiv 2507.23279; moejax/analysis/super_expert_ablation.py)
on the tiny sink-token LM: the removed contributions by a numpy loop, a planted super
expert's sink and its ablation, and the study's arms by hand."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.analysis import super_expert_ablation as ablation
from moejax.analysis import super_experts as se
from moejax.errors import ConfigError
from tests.analysis.super_expert_model import SINK_TOKEN, captured, copy, swiglu_numpy


def test_ablation_removes_exactly_the_routed_contributions_of_the_expert(sink_lm):
  """Ablating experts of the last MoE layer: the block's output is the original minus,
  for every valid slot routed to them, combine weight x the expert's output (a numpy
  loop); the earlier block is untouched; the params given are not modified."""
  config, graphdef, params, rest, tokens = sink_lm
  pairs = [(1, 2), (1, 5)]
  before = np.asarray(params["blocks"][1]["ffn"]["experts"]["w_down"])
  ablated = ablation.ablate_experts(config.model, params, pairs)
  np.testing.assert_array_equal(params["blocks"][1]["ffn"]["experts"]["w_down"], before)
  for name, value in params["blocks"][1]["ffn"].items():
    if name != "experts":  # the router is untouched
      np.testing.assert_array_equal(ablated["blocks"][1]["ffn"][name], value)
  plain, routing = jax.device_get(captured(graphdef, params, rest, tokens))
  cut, cut_routing = jax.device_get(captured(graphdef, ablated, rest, tokens))
  np.testing.assert_array_equal(cut_routing[1][0], routing[1][0])  # same experts chosen
  np.testing.assert_array_equal(cut["h"][0], plain["h"][0])
  w = {k: np.asarray(v, np.float64) for k, v in params["blocks"][1]["ffn"]["experts"].items()}
  x = np.asarray(plain["x"][1], np.float64).reshape(-1, config.model.d_model)
  index, valid = routing[1]
  expected = np.asarray(plain["h"][1], np.float64).reshape(-1, config.model.d_model).copy()
  removed = 0
  for t in range(x.shape[0]):
    for s in range(index.shape[1]):
      if valid[t, s] and (1, int(index[t, s])) in pairs:
        expected[t] -= plain["weight"][1][t, s] * swiglu_numpy(w, index[t, s], x[t])
        removed += 1
  assert removed > 0
  np.testing.assert_allclose(np.asarray(cut["h"][1]).reshape(expected.shape), expected, atol=1e-5)


def test_ablation_refuses_a_pair_it_cannot_ablate(sink_lm):
  config, _, params, _, _ = sink_lm

  with pytest.raises(ConfigError, match=r"2 MoE layers \(pair=\(2, 0\)\)"):
    ablation.ablate_experts(config.model, params, [(0, 1), (2, 0)])
  with pytest.raises(ConfigError, match=r"has 8 experts \(pair=\(1, 8\)\)"):
    ablation.ablate_experts(config.model, params, [(1, 8)])
  atomic = config.model.copy_and_resolve_references()
  atomic.moe.experts = "atomic"
  with pytest.raises(ConfigError, match=r"'atomic'.* \(pair=\(0, 0\)\)"):
    ablation.ablate_experts(atomic, params, [(0, 0)])


MARKER, CARRIER, CONSTANT = 0, 1, 2  # embedding channels of the planted model


def plant_super_expert(config, params, expert: int):
  """Expert `expert` of MoE layer 0 becomes a super expert that makes block 1's
  attention a sink. SINK_TOKEN alone has the MARKER channel (4.0); the router
  sends it to the expert; one hidden unit of the expert reads MARKER, so only
  that token gets it, and writes hundreds into CARRIER, which nothing else writes
  (no embedding, no block-0 attention output, no other expert). Block 1's keys
  read only CARRIER and its queries only CONSTANT, a channel 4.0 in every
  embedding row: every query scores key 0 high and every other key exactly 0.
  Without the expert every key is 0, so attention is exactly uniform."""
  m = config.model
  params = copy(params)
  embed = params["embed"].at[:, (MARKER, CARRIER)].set(0.0).at[:, CONSTANT].set(4.0)
  params["embed"] = embed.at[SINK_TOKEN, MARKER].set(4.0)
  attn0, ffn0 = params["blocks"][0]["attn"], params["blocks"][0]["ffn"]
  attn0["o"]["kernel"] = attn0["o"]["kernel"].at[:, (MARKER, CARRIER)].set(0.0)
  w = ffn0["experts"]
  w["w_down"] = w["w_down"].at[:, :, CARRIER].set(0.0).at[expert, 0].set(0.0)
  w["w_down"] = w["w_down"].at[expert, 0, CARRIER].set(100.0)  # hidden unit 0 -> CARRIER
  for name in ("w_gate", "w_up"):
    w[name] = w[name].at[expert, :, 0].set(0.0).at[expert, MARKER, 0].set(1.0)
  ffn0["router_kernel"] = ffn0["router_kernel"].at[MARKER, expert].set(10.0)
  attn1 = params["blocks"][1]["attn"]  # j: the slowest RoPE pair, as in the sink test above
  j = m.head_dim - 2 if m.rope.interleave else m.head_dim // 2 - 1
  for name, channel in (("q", CONSTANT), ("k", CARRIER)):
    attn1[name]["bias"] = jnp.zeros_like(attn1[name]["bias"])
    attn1[name]["kernel"] = (
      jnp.zeros_like(attn1[name]["kernel"]).at[channel, j :: m.head_dim].set(2.0)
    )
  return params


def test_a_planted_super_expert_makes_the_sink_and_its_ablation_removes_it(sink_lm):
  config, graphdef, params, rest, tokens = sink_lm
  expert = 3
  planted = plant_super_expert(config, params, expert)
  out = se.profile((config, planted, rest), tokens)
  assert [(p["moe_layer"], p["expert"]) for p in out["super_experts"]] == [(0, expert)]
  assert out["massive_activations"]["massive_layers"] == [0]
  assert (
    out["massive_activations"]["layers"][0]["position"],
    out["massive_activations"]["layers"][0]["channel"],
  ) == (0, CARRIER)

  def sink(p):
    return np.asarray(se.attention_sink_mass(graphdef, p, rest, tokens))

  uniform = se.uniform_sink_mass(tokens.shape[1])
  assert sink(planted)[1] > 0.9
  assert sink(ablation.ablate_experts(config.model, planted, [(0, expert)]))[1] == pytest.approx(
    uniform, abs=1e-6
  )
  for other in (0, 7):  # another expert of the same layer, and one of the last
    assert sink(ablation.ablate_experts(config.model, planted, [(other // 7, other)]))[1] > 0.9
  assert sink(params)[1] < 0.5  # the unplanted model has no sink


@pytest.mark.integration
def test_study_arms_on_the_planted_model(sink_lm):
  config, graphdef, params, rest, tokens = sink_lm
  planted = plant_super_expert(config, params, 3)
  study = ablation.ablation_study((config, planted, rest), tokens, seeds=(0, 1), batch_rows=4)
  arms = {a["arm"]: a for a in study["arms"]}
  assert list(arms) == ["none", "super_experts", "most_frequent", "random_seed0", "random_seed1"]
  assert study["n"] == 1 and all(len(a["experts"]) == 1 for a in study["arms"][1:])
  assert [(e["moe_layer"], e["expert"]) for e in arms["super_experts"]["experts"]] == [(0, 3)]
  uniform = se.uniform_sink_mass(tokens.shape[1])
  assert arms["none"]["mass_on_position_0"][1] > 0.9
  assert arms["super_experts"]["mass_on_position_0"][1] == pytest.approx(uniform, abs=1e-6)
  assert arms["none"]["max_residual"] > 100 > 10 > arms["super_experts"]["max_residual"]
  # each arm's figures are those of its own ablated model
  for arm in study["arms"]:
    ablated = ablation.ablate_experts(
      config.model, planted, [(e["moe_layer"], e["expert"]) for e in arm["experts"]]
    )
    np.testing.assert_allclose(
      arm["mass_on_position_0"], se.attention_sink_mass(graphdef, ablated, rest, tokens), rtol=1e-5
    )
  loss = next_token_loss_by_hand(graphdef, planted, rest, tokens)
  assert arms["none"]["loss_nats"] == pytest.approx(loss, rel=1e-5)


@functools.partial(jax.jit, static_argnums=0)
def logits_of(graphdef, params, rest, tokens):
  return nnx.merge(graphdef, params, rest)(tokens)[0]


def next_token_loss_by_hand(graphdef, params, rest, tokens) -> float:
  """Mean -log softmax(logits)[next token] in numpy over one forward of all rows."""
  logits = np.asarray(logits_of(graphdef, params, rest, tokens[:, :-1]), np.float64)
  top = logits.max(-1, keepdims=True)
  logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
  return float(-np.take_along_axis(logp, np.asarray(tokens)[:, 1:, None], -1).mean())


def test_study_arm_sizes_and_the_most_frequent_arm_by_hand(sink_lm):
  config, graphdef, params, rest, tokens = sink_lm
  scored = []
  study = ablation.ablation_study(
    (config, params, rest),
    tokens,
    n=3,
    seeds=(0, 1, 2),
    batch_rows=3,
    score=lambda m, p, r: scored.append(p) or {"x": 1},
    criterion={"rule": "massive_layers"},
  )
  arms = {a["arm"]: a for a in study["arms"]}
  assert study["profile"]["super_experts"] == []  # none: the largest a instead
  assert list(arms) == [
    "none",
    "top_a",
    "most_frequent",
    "random_seed0",
    "random_seed1",
    "random_seed2",
  ]
  pairs = {
    name: [(e["moe_layer"], e["expert"]) for e in arm["experts"]] for name, arm in arms.items()
  }
  assert pairs["none"] == [] and len(scored) == 6 and arms["none"]["x"] == 1
  for name, found in pairs.items():
    if name != "none":
      assert len(found) == len(set(found)) == 3
  assert len({tuple(p) for name, p in pairs.items() if name.startswith("random")}) > 1
  peaks = np.asarray(se.expert_output_peaks(graphdef, params, rest, tokens))
  assert pairs["top_a"] == sorted(
    np.unravel_index(i, peaks.shape) for i in np.argsort(peaks, axis=None)[-3:]
  )
  # routing counts by hand: every valid slot of every token
  _, routing = jax.device_get(captured(graphdef, params, rest, tokens))
  counts = np.stack([np.bincount(index[valid], minlength=8) for index, valid in routing])
  assert study["routed_slots"] == counts.tolist()
  assert counts.sum() == tokens.size * config.model.moe.top_k * 2
  layer, expert = np.unravel_index(np.argmax(counts), counts.shape)
  assert (layer, expert) in pairs["most_frequent"]
  one = ablation.ablation_study((config, params, rest), tokens, seeds=(), batch_rows=3)
  assert [(e["moe_layer"], e["expert"]) for e in one["arms"][2]["experts"]] == [(layer, expert)]
  # the loss, batched with a padded last batch, = one forward by hand
  assert arms["none"]["loss_nats"] == pytest.approx(
    next_token_loss_by_hand(graphdef, params, rest, tokens), rel=1e-5
  )

  with pytest.raises(ConfigError, match="n=17"):
    ablation.ablation_study((config, params, rest), tokens, n=17)
  with pytest.raises(ConfigError, match="twice"):
    ablation.ablation_study((config, params, rest), tokens, seeds=(1, 1))
