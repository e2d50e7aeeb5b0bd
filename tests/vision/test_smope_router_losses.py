"""Oracles for SMoPE's official router losses (moejax/adapters/smope.py; the official
code's models/zoo.py router_loss): the margin cross-entropy and the old-key prototype
loss against float64 loops, the model's aux_loss against both written out from the
block's own queries, when they are off, and what they move."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.adapters.smope import margin_router_loss, old_key_loss, top_experts
from tests.vision.test_smope import HEAD_DIM, HEADS, build, digits_cfg, images
from moejax.errors import ConfigError
from moejax.models.vit import validate_vit


def log_softmax(row):
  row = np.asarray(row, np.float64)
  return row - row.max() - np.log(np.sum(np.exp(row - row.max())))


def margin_by_hand(scores, chosen, margin):
  """sum_h sum_{j in S} mean_b -log softmax(s + margin * (max - min) * 1[not S])_j."""
  b_count, h_count, n = scores.shape
  total = 0.0
  for h in range(h_count):
    for i in range(chosen.shape[-1]):
      terms = []
      for b in range(b_count):
        s = np.asarray(scores[b, h], np.float64)
        lifted = s + margin * (s.max() - s.min()) * ~np.isin(np.arange(n), chosen[b, h])
        terms.append(-log_softmax(lifted)[chosen[b, h, i]])
      total += np.mean(terms)
  return total


def old_keys_by_hand(keys, old, frequent, top_k):
  """sum_h sum_{i <= K} mean over frequent u of -log softmax(o_u . P)[top_i(o_u . O)]."""
  total = 0.0
  for h in range(keys.shape[0]):
    rows = [u for u in range(keys.shape[1]) if frequent[h, u]]
    for i in range(top_k):
      terms = []
      for u in rows:
        target = np.argsort(-(old[h] @ old[h, u]), kind="stable")[i]
        terms.append(-log_softmax(keys[h] @ old[h, u])[target])
      total += np.mean(terms) if terms else 0.0
  return total


def test_the_margin_loss_equals_its_formula_by_loops():
  rng = np.random.default_rng(0)
  scores = rng.standard_normal((3, 2, 5)).astype(np.float32)
  chosen = np.asarray(top_experts(jnp.asarray(scores), jnp.zeros((3, 2, 5)), 2))
  for margin in (0.0, 0.4):
    got = float(margin_router_loss(jnp.asarray(scores), jnp.asarray(chosen), margin))
    np.testing.assert_allclose(got, margin_by_hand(scores, chosen, margin), rtol=1e-5)


def test_a_margin_makes_the_loss_larger_unless_the_selected_experts_already_lead():
  """With eps > 0 every unselected score is lifted, so each selected expert's CE grows."""
  scores = jnp.asarray([[[3.0, 2.0, 1.0, 0.0]]])
  chosen = jnp.asarray([[[0, 1]]])
  assert float(margin_router_loss(scores, chosen, 0.4)) > float(
    margin_router_loss(scores, chosen, 0.0)
  )


def test_the_old_key_loss_equals_its_formula_by_loops_and_a_head_without_rows_adds_zero():
  rng = np.random.default_rng(1)
  keys = rng.standard_normal((3, 6, 4)).astype(np.float32)
  old = rng.standard_normal((3, 6, 4)).astype(np.float32)
  frequent = np.zeros((3, 6), bool)
  frequent[0, [1, 4]] = True
  frequent[1, :] = True  # head 2: no frequent expert
  got = float(old_key_loss(jnp.asarray(keys), jnp.asarray(old), jnp.asarray(frequent), 2))
  np.testing.assert_allclose(got, old_keys_by_hand(keys, old, frequent, 2), rtol=1e-5)
  none = old_key_loss(jnp.asarray(keys), jnp.asarray(old), jnp.zeros((3, 6), bool), 2)
  assert float(none) == 0.0


def model_with_losses(router_weight, old_key_weight, experts=5, top_k=2):
  model = build(experts=experts, top_k=top_k, layers=1, blocks=1)
  model.prompt.router_weight, model.prompt.old_key_weight = router_weight, old_key_weight
  return model


def block_queries(model, x):
  """q [B, L, H, K] of block 0 in float64: the attention's input through the block's own
  norm, times W_Q (the ViT has no rotary embedding)."""
  normed = np.asarray(model.blocks[0].attn_norm(model.embed(x)), np.float64)
  w_q = np.asarray(model.blocks[0].attn.q.kernel[...], np.float64)
  b, length, _ = normed.shape
  return (normed @ w_q).reshape(b, length, HEADS, HEAD_DIM)


def test_the_models_aux_loss_is_both_weighted_losses_of_its_own_queries():
  model = model_with_losses(router_weight=0.3, old_key_weight=0.7)
  prompt = model.prompt
  rng = np.random.default_rng(2)
  prompt.frequent[...] = jnp.asarray(rng.random((1, HEADS, 5)) < 0.4)
  prompt.old_keys[...] = jnp.asarray(rng.standard_normal((1, HEADS, 5, HEAD_DIM)), jnp.float32)
  x = images(batch=3)
  keys = np.asarray(prompt.keys[0], np.float64)
  q = block_queries(model, x)
  scores = np.einsum("blhk,hnk->bhn", q, keys) / q.shape[1]
  spread = scores.max(-1, keepdims=True) - scores.min(-1, keepdims=True)
  offset = prompt.penalty * np.asarray(prompt.frequent[0], np.float64)[None] * spread
  chosen = np.argsort(-(scores - offset), axis=-1, kind="stable")[..., :2]
  want = 0.3 * margin_by_hand(scores, chosen, prompt.penalty) + 0.7 * old_keys_by_hand(
    keys, np.asarray(prompt.old_keys[0], np.float64), np.asarray(prompt.frequent[0]), 2
  )
  got = float(model(x, train=True)[1]["aux_loss"])
  np.testing.assert_allclose(got, want, rtol=2e-5)


@pytest.mark.parametrize(
  "case",
  ["evaluation", "weights 0", "K = N", "assigned experts"],
)
def test_no_router_loss_where_the_official_code_adds_none(case):
  model = model_with_losses(0.3, 0.7, top_k=5 if case == "K = N" else 2)
  model.prompt.frequent[...] = jnp.ones_like(model.prompt.frequent[...])
  if case == "weights 0":
    model.prompt.router_weight = model.prompt.old_key_weight = 0.0
  if case == "assigned experts":
    model.prompt.assign(np.array([[0, 1]]))
  aux = model(images(), train=case != "evaluation")[1]["aux_loss"]
  assert float(aux) == 0.0


def test_end_task_keeps_the_keys_as_old_keys_and_the_loss_then_starts():
  model = model_with_losses(0.0, 1.0)
  assert float(model(images(), train=True)[1]["aux_loss"]) == 0.0  # nothing frequent yet
  model.prompt.counts[...] = jnp.ones_like(model.prompt.counts[...])
  model.prompt.end_task()
  np.testing.assert_array_equal(np.asarray(model.prompt.old_keys[...]), model.prompt.keys[...])
  assert float(model(images(), train=True)[1]["aux_loss"]) > 0.0


def test_the_margin_loss_moves_every_key_and_no_unselected_value():
  """Its softmax runs over all N scores, so unselected experts' keys get gradient (the
  task loss gives them none); values never enter it."""
  model = model_with_losses(1.0, 0.0, experts=6)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def aux(p):
    return nnx.merge(graphdef, p, rest)(images(batch=1), train=True)[1]["aux_loss"]

  grads = jax.grad(aux)(params)["prompt"]
  assert np.all(np.any(np.asarray(grads["keys"][...]) != 0, axis=-1))
  assert not np.any(np.asarray(grads["values"][...]))


@pytest.mark.parametrize("key", ["router_weight", "old_key_weight"])
def test_a_negative_weight_is_refused_naming_the_key(key):
  with pytest.raises(ConfigError) as error:
    validate_vit(digits_cfg(**{f"smope.{key}": -1e-5}))
  assert f"model.vit.prompt.smope.{key}=-1e-05" in str(error.value)
