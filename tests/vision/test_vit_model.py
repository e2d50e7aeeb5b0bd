"""Oracles for the ViT (moejax/models/vit.py): one expert at weight 1 is the dense MLP,
the non-causal attention is softmax(Q K^T / sqrt(d)) V written by hand, and
permuting the patches with their position embeddings leaves mean-pooled logits
unchanged (attention, MoE routing and dispatch are per-token equivariant)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.config import base_config
from moejax.layers.attention import GroupedQueryAttention
from moejax.models.decoder import stack_layers
from moejax.models.vit import VisionTransformer, num_tokens, patchify
from moejax.train.step import split_model

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

BATCH = 3


def tiny_model_cfg(**changes) -> ml_collections.ConfigDict:
  """A 2-block ViT of width 16 on 8x8x1 images in 2x2 patches; every block MoE."""
  m = base_config().model
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.d_ff = 16, 2, 4, 2, 8, 24
  m.moe.num_experts, m.moe.top_k, m.moe.expert_d_ff = 4, 2, 12
  m.moe.first_dense, m.moe.every_n = 0, 1
  for key, value in changes.items():
    node, *path = key.split(".")
    section = m
    for part in [node, *path][:-1]:
      section = section[part]
    section[[node, *path][-1]] = value
  return m


def build(m, seed=0):
  return VisionTransformer(ml_collections.FrozenConfigDict(m), rngs=nnx.Rngs(seed))


def images(seed=0, batch=BATCH):
  return jax.random.uniform(jax.random.key(seed), (batch, 8, 8, 1), jnp.float32)


def unpatchify(patches_BxNxD, image_size: int, patch_size: int, channels: int):
  """The inverse of patchify, written the other way round (a loop over patch cells)."""
  b = patches_BxNxD.shape[0]
  side = image_size // patch_size
  out = np.zeros((b, image_size, image_size, channels), np.float32)
  for n in range(side * side):
    row, col = divmod(n, side)
    out[:, row * patch_size : (row + 1) * patch_size, col * patch_size : (col + 1) * patch_size] = (
      np.asarray(patches_BxNxD[:, n]).reshape(b, patch_size, patch_size, channels)
    )
  return out


def test_patchify_is_undone_by_the_loop_inverse():
  x = images()
  np.testing.assert_array_equal(unpatchify(patchify(x, 2), 8, 2, 1), np.asarray(x))
  assert patchify(x, 4).shape == (BATCH, 4, 16)


@pytest.mark.integration
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_one_expert_at_weight_one_is_the_dense_vit(pooling):
  """ViT-MoE, E = 1, top-1 (router weight softmax over one expert = 1) with the dense
  ViT's MLP weights as its expert: the same logits."""
  dense = build(tiny_model_cfg(ffn_type="dense", **{"vit.pooling": pooling}), seed=0)
  moe = build(
    tiny_model_cfg(
      **{"vit.pooling": pooling, "moe.num_experts": 1, "moe.top_k": 1, "moe.expert_d_ff": 24}
    ),
    seed=1,
  )
  dense_params = nnx.to_pure_dict(nnx.state(dense, nnx.Param))
  moe_params = nnx.to_pure_dict(nnx.state(moe, nnx.Param))
  for key in dense_params:
    if key != "blocks":
      moe_params[key] = dense_params[key]
  for i, block in dense_params["blocks"].items():
    for name, value in block.items():
      if name != "ffn":
        moe_params["blocks"][i][name] = value
    experts = moe_params["blocks"][i]["ffn"]["experts"]
    for proj in ("gate", "up", "down"):
      experts[f"w_{proj}"] = block["ffn"][proj]["kernel"][None]
  nnx.update(moe, moe_params)
  x = images()
  want, _, _ = dense(x)
  got, aux, _ = moe(x)
  assert got.shape == (BATCH, 10)
  for layer in aux["moe"]:
    np.testing.assert_allclose(np.asarray(layer["combine_weight"]), 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  # The check can fail: another expert width-slice changes the logits.
  moe_params["blocks"][0]["ffn"]["experts"]["w_up"] = (
    moe_params["blocks"][0]["ffn"]["experts"]["w_up"] * 1.5
  )
  nnx.update(moe, moe_params)
  assert not np.allclose(np.asarray(moe(x)[0]), np.asarray(want), atol=1e-3)


def test_non_causal_attention_is_the_hand_written_softmax():
  """Every query sees every key: out = concat_h softmax(q_h k_g^T / sqrt(d)) v_g, then W_o,
  for query head h reading key/value head g = h // (H / G), in float64 numpy."""
  m = tiny_model_cfg()
  attn = GroupedQueryAttention(
    ml_collections.FrozenConfigDict(m), rngs=nnx.Rngs(3), dtype=jnp.float32
  )
  x = jax.random.normal(jax.random.key(4), (2, 5, m.d_model), jnp.float32)
  got, _ = attn(x, None, jnp.ones((1, 1, 1), bool))
  w = {name: np.asarray(getattr(attn, name).kernel[...], np.float64) for name in "qkvo"}
  xs = np.asarray(x, np.float64)
  h, g, d = m.num_heads, m.num_kv_heads, m.head_dim
  want = np.zeros((2, 5, m.d_model))
  for b in range(2):
    q = (xs[b] @ w["q"]).reshape(5, h, d)
    k, v = ((xs[b] @ w[n]).reshape(5, g, d) for n in "kv")
    heads = []
    for head in range(h):
      kv = head // (h // g)
      scores = q[:, head] @ k[:, kv].T / np.sqrt(d)
      probs = np.exp(scores - scores.max(axis=1, keepdims=True))
      heads.append((probs / probs.sum(axis=1, keepdims=True)) @ v[:, kv])
    want[b] = np.concatenate(heads, axis=1) @ w["o"]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
  # Causal (the decoder's mask) is a different function: the first query sees one key.
  causal, _ = attn(x, None, jnp.tril(jnp.ones((5, 5), bool))[None])
  assert not np.allclose(np.asarray(causal[:, 0]), want[:, 0], atol=1e-3)


@pytest.mark.parametrize("ffn_type", ["moe", "dense"])
def test_permuting_patches_with_their_positions_keeps_mean_pooled_logits(ffn_type):
  m = tiny_model_cfg(ffn_type=ffn_type, **{"vit.pooling": "mean"})
  model = build(m)
  x = images(seed=5)
  want, _, _ = model(x)
  perm = np.random.default_rng(0).permutation(num_tokens(m))
  permuted = unpatchify(np.asarray(patchify(x, 2))[:, perm], 8, 2, 1)
  moved, _, _ = model(permuted)  # patches moved, positions not: a different input
  assert not np.allclose(np.asarray(moved), np.asarray(want), atol=1e-4)
  model.position[...] = model.position[...][perm]
  got, _, _ = model(permuted)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_the_cls_token_and_the_moe_blocks_are_where_the_config_says():
  m = tiny_model_cfg(num_layers=4, **{"moe.first_dense": 1, "moe.every_n": 2})
  model = build(m)
  assert [block.is_moe for block in model.blocks] == [False, True, False, True]
  assert model.position.shape == (17, 16) and model.cls_token.shape == (1, 1, 16)
  logits, aux, cache = model(images())
  assert logits.dtype == jnp.float32 and cache is None and len(aux["moe"]) == 2
  assert aux["aux_loss"].shape == () and float(aux["aux_loss"]) > 0


@pytest.mark.integration
@pytest.mark.parametrize("scan_layers, remat", [(True, "none"), (False, "save_moe_routing")])
def test_scan_and_remat_compute_the_loop_model(scan_layers, remat):
  """The decoder's scale skeleton: a scanned ViT holding the loop model's parameters
  stacked (stack_layers; from a seed it draws its own) computes the loop model's logits;
  remat recomputes the same logits and gradients."""
  x = images(seed=6)

  def logits_and_position_grad(model):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
      logits = nnx.merge(graphdef, p, rest)(x)[0]
      return jnp.sum(logits**2), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(logits), np.asarray(grads["position"][...])

  loop = build(tiny_model_cfg())
  model = build(tiny_model_cfg(scan_layers=scan_layers, remat=remat))
  if scan_layers:  # from a seed a scanned model draws its own parameters: the loop's, stacked
    _, params, rest = stack_layers(loop.cfg, *split_model(loop)[1:])
    model = nnx.merge(nnx.graphdef(model), params, rest)
  want_logits, want_grad = logits_and_position_grad(loop)
  logits, grad = logits_and_position_grad(model)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
