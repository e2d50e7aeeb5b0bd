"""Every registered model (moejax.models.MODELS) keeps the contract the trainer relies on:
its config validates, build_model builds it, a call returns (float32 logits, {"aux_loss":
float32 scalar, "moe": one entry per MoE layer of the config}, None), the train step's
loss is the cross-entropy plus the router losses, its gradient reaches every parameter,
and a small step against it lowers the loss. A registered model without a case here fails
test_every_registered_model_is_a_case."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from moejax import models
from moejax.config import base_config
from moejax.configs import vit_digits_moe
from moejax.models.structure import moe_layer_indices
from moejax.train import step as step_lib
from moejax.validation import validate_config

BATCH = 4


def tiny(c):
  """2 blocks of width 16, block 1 MoE (4 experts, top-2)."""
  m = c.model
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.d_ff = 16, 2, 2, 1, 8, 16
  m.moe.num_experts, m.moe.top_k, m.moe.expert_d_ff = 4, 2, 8
  m.moe.first_dense, m.moe.every_n = 1, 1
  return c


def decoder_case():
  c = tiny(base_config())
  tokens = jax.random.randint(jax.random.key(0), (BATCH, 9), 0, c.model.vocab_size)
  return c, {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}, (BATCH, 8, c.model.vocab_size)


def vit_case():
  c = tiny(vit_digits_moe.get_config())
  images = jax.random.uniform(jax.random.key(0), (BATCH, 8, 8, 1))
  return c, {"inputs": images, "targets": jnp.arange(BATCH) % 10}, (BATCH, 10)


CASES = {"decoder": decoder_case, "vit": vit_case}


def test_every_registered_model_is_a_case():
  assert set(models.MODELS) == set(CASES)


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_model_keeps_the_trainer_contract(name):
  config, batch, logits_shape = CASES[name]()
  assert config.model_name == name
  validate_config(config)
  model = models.build_model(name, ml_collections.FrozenConfigDict(config.model), rngs=nnx.Rngs(0))
  graphdef, params, rest = step_lib.split_model(model)
  logits, aux, cache = jax.eval_shape(
    lambda p, r: nnx.merge(graphdef, p, r)(batch["inputs"], train=False), params, rest
  )
  assert logits.shape == logits_shape and logits.dtype == jnp.float32 and cache is None
  assert aux["aux_loss"].shape == () and aux["aux_loss"].dtype == jnp.float32
  assert len(aux["moe"]) == len(moe_layer_indices(config.model)) == 1

  value_and_grad = jax.jit(jax.value_and_grad(step_lib.make_loss_fn(graphdef), has_aux=True))
  (loss, (ce, aux, _, _)), grads = value_and_grad(params, rest, batch, jax.random.key(1))
  assert float(loss) == pytest.approx(float(ce) + float(aux["aux_loss"]), rel=1e-6)
  assert float(aux["aux_loss"]) > 0  # the MoE layer's router losses are in the loss
  zero = [
    jax.tree_util.keystr(path)
    for path, g in jax.tree_util.tree_leaves_with_path(grads)
    if not np.any(np.asarray(g))
  ]
  assert zero == [], f"{name}: no gradient reaches {zero}"
  # A small step against the gradient lowers the loss on the same batch.
  stepped = jax.tree.map(lambda p, g: p - 1e-2 * g / optax.tree.norm(grads), params, grads)
  (lower, _), _ = value_and_grad(stepped, rest, batch, jax.random.key(1))
  assert float(lower) < float(loss)
