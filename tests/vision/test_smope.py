"""Oracles for SMoPE (moejax/adapters/smope.py) in the one attention's prefix hook: the
proxy score against the per-query logits averaged by loops, the attention with K = N
and K < N against prefix tuning written in float64 numpy, zero gradients for the
experts not selected, the usage rules on hand examples, and one-line refusals."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.adapters.smope import proxy_scores, top_experts
from moejax.config import base_config
from moejax.configs import vit_digits_moe
from moejax.errors import ConfigError
from moejax.models.vit import VisionTransformer, validate_vit

HEADS, KV_HEADS, HEAD_DIM, D = 4, 2, 8, 16


def smope_cfg(experts=4, top_k=2, proxy_logits=True, blocks=0, layers=2):
  m = base_config().model
  m.scan_layers = False
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim = D, layers, HEADS, KV_HEADS, 8
  m.d_ff, m.ffn_type = 24, "dense"
  m.vit.prompt.adapter, m.vit.prompt.num_tokens = "smope", experts
  s = m.vit.prompt.smope
  s.top_k, s.proxy_logits, s.blocks = top_k, proxy_logits, blocks
  return ml_collections.FrozenConfigDict(m)


def build(**kw):
  return VisionTransformer(smope_cfg(**kw), rngs=nnx.Rngs(0))


def images(seed=0, batch=2):
  return jax.random.uniform(jax.random.key(seed), (batch, 8, 8, 1), jnp.float32)


def test_the_proxy_score_is_the_mean_of_the_per_query_prompt_logits():
  rng = np.random.default_rng(0)
  q = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)  # [B, L, H, K]
  keys = rng.standard_normal((3, 6, 4)).astype(np.float32)  # [H, N, K]
  want = np.zeros((2, 3, 6))
  for b in range(2):
    for h in range(3):
      for j in range(6):
        want[b, h, j] = sum(float(q[b, i, h] @ keys[h, j]) for i in range(5)) / 5
  got = proxy_scores(jnp.asarray(q), jnp.asarray(keys))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def by_hand(attn, x, keys, values, top_k, proxy_logits):
  """Prefix tuning in float64 numpy on the module's projections: per image and head the
  top_k experts by the loop-averaged logit, one softmax over [experts; tokens]."""
  x = np.asarray(x, np.float64)
  proj = {n: np.asarray(getattr(attn, n).kernel[...], np.float64) for n in "qkvo"}
  b, length, _ = x.shape
  q = (x @ proj["q"]).reshape(b, length, HEADS, HEAD_DIM)
  k = (x @ proj["k"]).reshape(b, length, KV_HEADS, HEAD_DIM)
  v = (x @ proj["v"]).reshape(b, length, KV_HEADS, HEAD_DIM)
  out = np.zeros((b, length, HEADS, HEAD_DIM))
  for i in range(b):
    for h in range(HEADS):
      g = h // (HEADS // KV_HEADS)
      mean_logit = np.array([np.mean([q[i, t, h] @ p for t in range(length)]) for p in keys[h]])
      chosen = np.sort(np.argsort(-mean_logit)[:top_k])
      prompt = (
        np.stack([mean_logit[chosen]] * length) if proxy_logits else q[i, :, h] @ keys[h, chosen].T
      )
      logits = np.concatenate([prompt, q[i, :, h] @ k[i, :, g].T], axis=1) / np.sqrt(HEAD_DIM)
      probs = np.exp(logits - logits.max(1, keepdims=True))
      probs /= probs.sum(1, keepdims=True)
      out[i, :, h] = probs @ np.concatenate([values[h, chosen], v[i, :, g]])
  return out.reshape(b, length, -1) @ proj["o"]


@pytest.mark.parametrize(
  "top_k, proxy_logits",
  [(4, False), (4, True), (2, True), (2, False)],
  ids=["K=N dense prefix tuning", "K=N proxy logits", "K<N proxy logits", "K<N per-query"],
)
def test_the_attention_is_prefix_tuning_over_the_selected_experts(top_k, proxy_logits):
  model = build(experts=4, top_k=top_k, proxy_logits=proxy_logits)
  attn = model.blocks[0].attn
  x = jax.random.normal(jax.random.key(1), (2, 6, D), jnp.float32)
  hook = model.prompt.attention_prefix(0, train=False)
  got, _ = attn(x, None, jnp.ones((1, 1, 1), bool), prefix=hook)
  keys, values = (np.asarray(p[0], np.float64) for p in (model.prompt.keys, model.prompt.values))
  want = by_hand(attn, x, keys, values, top_k, proxy_logits)
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def test_k_equal_to_n_is_dense_prefix_tuning_through_the_whole_model():
  """The model with K = N and per-query logits equals the same weights with the hook
  replaced by dense prefix tuning (every expert, logits q_l . p_j^K)."""
  model = build(experts=3, top_k=3, proxy_logits=False)
  keys, values = model.prompt.keys[...], model.prompt.values[...]

  def dense(layer, train, losses=None):
    if layer >= keys.shape[0]:
      return None
    return lambda q: (
      jnp.einsum("blhk,hpk->bhlp", q, keys[layer]),
      jnp.broadcast_to(values[layer][None], (q.shape[0], *values[layer].shape)),
    )

  got = model(images())[0]
  model.prompt.attention_prefix = dense
  np.testing.assert_allclose(np.asarray(got), np.asarray(model(images())[0]), rtol=1e-6, atol=1e-6)


def test_experts_not_selected_get_exactly_zero_gradient():
  model = build(experts=6, top_k=2, layers=2, blocks=2)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  weights = jax.random.normal(jax.random.key(3), (1, 10))

  def loss(p):
    return jnp.sum(nnx.merge(graphdef, p, rest)(images(batch=1))[0] * weights)

  grads = jax.jit(jax.grad(loss))(params)["prompt"]
  model.prompt.count_selections()
  model(images(batch=1))
  counted = np.asarray(model.prompt.counts[...]) > 0  # [blocks, H, N]: this image's top-K
  assert counted.sum(-1).tolist() == [[2] * HEADS] * 2
  for name in ("keys", "values"):
    moved = np.any(np.asarray(grads[name][...]) != 0, axis=-1)
    np.testing.assert_array_equal(moved, counted, err_msg=name)


def test_usage_penalties_follow_the_official_rules_on_hand_examples():
  scores = jnp.array([[[5.0, 4.0, 3.0, 0.0]]])
  # frequent expert 0 loses 0.4 * (5 - 0) = 2: 3 < 4, so expert 1 is chosen
  offset = jnp.array([[[0.4, 0.0, 0.0, 0.0]]])
  assert top_experts(scores, offset, 1).tolist() == [[[1]]]
  assert top_experts(scores, jnp.zeros_like(offset), 1).tolist() == [[[0]]]
  model = build(experts=4, top_k=2, layers=2, blocks=1)
  model.prompt.counts[...] = jnp.zeros((1, HEADS, 4)).at[0, 0].set(jnp.array([0, 3, 1, 2.0]))
  model.prompt.end_task()
  # head 0: the mean over used experts is 2, so experts 1 and 3 are frequent
  assert np.asarray(model.prompt.frequent[0, 0]).tolist() == [False, True, False, True]
  evaluation = np.asarray(model.prompt.offset(0, train=False)[0])
  np.testing.assert_array_equal(evaluation, [2.0, 0.0, 0.0, 0.0])


def digits_cfg(**prompt):
  c = vit_digits_moe.get_config()
  c.model.scan_layers = False
  c.model.vit.prompt.adapter = "smope"
  for key, value in prompt.items():
    section, _, leaf = key.rpartition(".")
    (c.model.vit.prompt[section] if section else c.model.vit.prompt)[leaf] = value
  return c


@pytest.mark.parametrize(
  "changes, names",
  [
    ({"num_tokens": 4, "smope.top_k": 5}, ["model.vit.prompt.smope.top_k=5", "num_tokens=4"]),
    ({"num_tokens": 0, "smope.top_k": 1}, ["model.vit.prompt.num_tokens=0"]),
    ({"smope.top_k": 0}, ["model.vit.prompt.smope.top_k=0"]),
    ({"smope.blocks": 9}, ["model.vit.prompt.smope.blocks=9", "model.num_layers=4"]),
    ({"smope.penalty": -1.0}, ["model.vit.prompt.smope.penalty=-1.0"]),
  ],
)
def test_bad_smope_settings_are_refused_in_one_line_naming_the_key(changes, names):
  with pytest.raises(ConfigError) as error:
    validate_vit(digits_cfg(**changes))
  message = str(error.value)
  assert "\n" not in message and all(name in message for name in names), message
