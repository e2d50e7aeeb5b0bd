"""Compressed expert types (issue 15) under expert, FSDP and tensor parallelism:
the tiny LM's loss and gradients on fsdp2_expert2_tensor2 equal one device.
Their codes, scales and codebooks follow CODE_AXES (experts/compressed.py),
which never split the FFN width: split over 'tensor' like SwiGLU's, w_down's
per-group scales (and its Hadamard rotation) would pair with other rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax import sharding
from moejax.train import step as step_lib
from moejax.train.distributed import make_placement
from moejax.train.loop import build_model
from tests.sharding.multidevice.common import MESHES, tiny_config


def config_for(experts, mesh=None):
  c = tiny_config(mesh=mesh)
  c.model.moe.experts = experts
  c.model.moe[experts].group_size = 8  # 4 groups along expert_d_ff = 32
  if experts == "codebook":
    c.model.moe.codebook.rotation = "hadamard"
  return c


def loss_and_grads(config, layout):
  """Loss and parameter gradients; the compressed arrays (`rest`) placed as
  the trainer places them."""
  graphdef, params, rest = step_lib.split_model(build_model(config))
  tokens = jnp.asarray(
    np.random.default_rng(0).integers(0, 256, (config.data.batch_size, config.data.seq_len + 1)),
    jnp.int32,
  )

  def loss_fn(params, rest):
    logits, aux, _ = nnx.merge(graphdef, params, rest)(
      tokens[:, :-1], train=True, rng=jax.random.key(1)
    )
    return step_lib.cross_entropy(logits, tokens[:, 1:]) + aux["aux_loss"]

  grad_fn = jax.value_and_grad(loss_fn)
  if layout is None:
    return jax.jit(grad_fn)(params, rest)
  state = make_placement(config, layout, build_model).state
  return step_lib.jit_on_mesh(grad_fn, layout)(
    jax.device_put(params, state.params), jax.device_put(rest, state.rest)
  )


@pytest.mark.integration
@pytest.mark.parametrize("experts", ["quantized", "codebook"])
def test_loss_and_gradients_equal_one_device(experts):
  config = config_for(experts, MESHES["fsdp2_expert2_tensor2"])
  loss, grads = loss_and_grads(config, sharding.make_layout(config))
  loss1, grads1 = loss_and_grads(config_for(experts), None)
  np.testing.assert_allclose(float(loss), float(loss1), rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, grads1)
