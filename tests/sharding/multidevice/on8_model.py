"""The whole LM on the acceptance meshes against one device (loss and every
gradient, fp32, 1e-5), parameter bytes per device, and bad mesh input."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax import sharding
from moejax.errors import ConfigError
from moejax.train import step as step_lib
from moejax.train.distributed import make_placement
from moejax.train.loop import build_model, train_and_evaluate
from tests.helpers import set_key
from tests.sharding.multidevice.common import MESHES, one_device, tiny_config


def config_for(dispatch, mesh=None):
  # One shared expert beside the routed ones; capacity 1.0 so that tokens drop.
  c = tiny_config(arg=f"dispatch={dispatch},shared=1", mesh=mesh)
  c.model.moe.capacity_factor = 1.0
  return c


def loss_and_grads(config, layout):
  graphdef, params, rest = step_lib.split_model(build_model(config))
  tokens = jnp.asarray(np.random.default_rng(0).integers(
      0, 256, (config.data.batch_size, config.data.seq_len + 1)), jnp.int32)

  def loss_fn(params):
    logits, aux = nnx.merge(graphdef, params, rest)(tokens[:, :-1], train=True,
                                                    rng=jax.random.key(1))
    return step_lib.cross_entropy(logits, tokens[:, 1:]) + aux["aux_loss"], aux["moe"]

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if layout is None:
    return jax.jit(grad_fn)(params)
  params = jax.device_put(params, make_placement(config, layout, build_model).state.params)
  return step_lib.jit_on_mesh(grad_fn, layout)(params)


@functools.cache
def one_device_result(dispatch):
  return loss_and_grads(config_for(dispatch), None)


@pytest.mark.parametrize("dispatch,mesh", [
    ("dropless", "data8"), ("dropless", "data2_expert4"), ("dropless", "fsdp2_expert2_tensor2"),
    ("capacity", "data8")])  # capacity on the EP meshes: on8_expert_parallel.py
def test_loss_and_gradients_equal_one_device(dispatch, mesh):
  config = config_for(dispatch, MESHES[mesh])
  (loss, moe), grads = loss_and_grads(config, sharding.make_layout(config))
  (loss1, moe1), grads1 = one_device_result(dispatch)
  np.testing.assert_allclose(float(loss), float(loss1), rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               grads, grads1)
  for layer, layer1 in zip(moe, moe1):
    np.testing.assert_allclose(layer["dropped_fraction"], layer1["dropped_fraction"], atol=1e-6)
  if dispatch == "capacity":
    assert float(moe1[0]["dropped_fraction"]) > 0  # capacity drops happen, identically


def per_device_bytes(array):
  return array.addressable_shards[0].data.nbytes


@pytest.mark.parametrize("mesh,expert_factor", [("data2_expert4", 4),
                                                 ("fsdp2_expert2_tensor2", 8)])
def test_expert_weights_shrink_per_device(mesh, expert_factor):
  """Expert weights split by the expert axis (x fsdp x tensor on the 3-axis mesh);
  Adam's moments follow their parameters (ZeRO-3)."""
  config = tiny_config(mesh=MESHES[mesh])
  placement = make_placement(config, sharding.make_layout(config), build_model)
  state = placement.init_state()
  for name in ("w_gate", "w_up", "w_down"):
    w = state.params["blocks"][0]["ffn"]["experts"][name]
    assert per_device_bytes(w) * expert_factor == w.nbytes, name
  adam = state.opt_state[1][0]
  for moment in (adam.mu, adam.nu):
    w = moment["blocks"][0]["ffn"]["experts"]["w_gate"]
    assert per_device_bytes(w) * expert_factor == w.nbytes
  embed = state.params["embed"]  # [vocab, d]: vocab over tensor, d over fsdp
  assert per_device_bytes(embed) * (1 if mesh == "data2_expert4" else 4) == embed.nbytes


@pytest.mark.parametrize("section,key,value,message", [
    ("mesh", "data", 3, r"the mesh \(mesh.data=3, mesh.fsdp=1, mesh.expert=4, mesh.tensor=1\) "
                        r"has 12 devices but 8 are available"),
    ("mesh", "expert", 3, r"mesh.data=-1 cannot fill the 8 devices"),
    ("mesh", "expert", 16, r"mesh.data=-1 cannot fill the 8 devices"),
    ("model.moe", "num_experts", 6, r"model.moe.num_experts=6 is not divisible by the "
                                    r"expert axis \(expert=4\)"),
    ("sharding.rules", "embed", "fsdp,experts", r"sharding.rules.embed='fsdp,experts': "
                                                r"'experts' is not a mesh axis"),
    ("data", "batch_size", 12, r"data.batch_size=12 is not divisible by the 8 batch shards"),
    ("sharding", "all_to_all", "nccl", r"sharding.all_to_all='nccl' is not known"),
])
def test_bad_mesh_input_is_rejected_before_compilation(data_dir, tmp_path, monkeypatch,
                                                       section, key, value, message):
  config = tiny_config(data_dir, mesh=dict(data=-1, expert=4 if key != "expert" else 1))
  set_key(config, f"{section}.{key}", value)
  compiled = []
  monkeypatch.setattr(step_lib, "make_train_step", lambda *a: compiled.append(a))
  monkeypatch.setattr(jax, "jit", lambda *a, **k: compiled.append(a))
  with pytest.raises(ConfigError, match=message):
    train_and_evaluate(config, str(tmp_path), write_metrics=False)
  assert not compiled


def test_one_device_has_no_layout():
  assert sharding.make_layout(tiny_config(), one_device()) is None
