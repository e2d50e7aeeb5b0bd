"""The whole LM on the acceptance meshes against one device (loss and every
gradient, fp32, 1e-5), parameter bytes per device, and bad mesh input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

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
  c.model.moe.capacity.factor = 1.0
  return c


def loss_and_grads(config, layout):
  graphdef, params, rest = step_lib.split_model(build_model(config))
  tokens = jnp.asarray(
    np.random.default_rng(0).integers(0, 256, (config.data.batch_size, config.data.seq_len + 1)),
    jnp.int32,
  )

  def loss_fn(params):
    logits, aux, _ = nnx.merge(graphdef, params, rest)(
      tokens[:, :-1], train=True, rng=jax.random.key(1)
    )
    return (
      step_lib.cross_entropy(logits, tokens[:, 1:]) + aux["aux_loss"],
      step_lib.moe_metrics(aux),
    )

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if layout is None:
    return jax.jit(grad_fn)(params)
  params = jax.device_put(params, make_placement(config, layout, build_model).state.params)
  return step_lib.jit_on_mesh(grad_fn, layout)(params)


@functools.cache
def one_device_result(dispatch):
  return loss_and_grads(config_for(dispatch), None)


@pytest.mark.parametrize(
  "dispatch,mesh",
  [
    ("dropless", "data8"),
    ("dropless", "data2_expert4"),
    ("dropless", "fsdp2_expert2_tensor2"),
    pytest.param("capacity", "data8", marks=pytest.mark.integration),
  ],
)  # capacity on the EP meshes: on8_expert_parallel.py
def test_loss_and_gradients_equal_one_device(dispatch, mesh):
  config = config_for(dispatch, MESHES[mesh])
  (loss, moe), grads = loss_and_grads(config, sharding.make_layout(config))
  (loss1, moe1), grads1 = one_device_result(dispatch)
  np.testing.assert_allclose(float(loss), float(loss1), rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, grads1)
  for layer, layer1 in zip(moe, moe1):
    np.testing.assert_allclose(layer["dropped_fraction"], layer1["dropped_fraction"], atol=1e-6)
  if dispatch == "capacity":
    assert float(moe1[0]["dropped_fraction"]) > 0  # capacity drops happen, identically


@functools.cache
def placed_state(mesh):
  """(layout, placement, fresh TrainState) of the tiny LM on MESHES[mesh], made once."""
  config = tiny_config(mesh=MESHES[mesh])
  layout = sharding.make_layout(config)
  placement = make_placement(config, layout, build_model)
  return layout, placement, placement.init_state()


def per_device_bytes(array):
  return array.addressable_shards[0].data.nbytes


@pytest.mark.parametrize("mesh,expert_factor", [("data2_expert4", 4), ("fsdp2_expert2_tensor2", 8)])
def test_expert_weights_shrink_per_device(mesh, expert_factor):
  """Expert weights split by the expert axis (x fsdp x tensor on the 3-axis mesh);
  Adam's moments follow their parameters (ZeRO-3)."""
  state = placed_state(mesh)[2]
  for name in ("w_gate", "w_up", "w_down"):
    w = state.params["blocks"][0]["ffn"]["experts"][name]
    assert per_device_bytes(w) * expert_factor == w.nbytes, name
  adam = state.opt_state[1][0]
  for moment in (adam.mu, adam.nu):
    w = moment["blocks"][0]["ffn"]["experts"]["w_gate"]
    assert per_device_bytes(w) * expert_factor == w.nbytes
  embed = state.params["embed"]  # [vocab, d]: vocab over tensor, d over fsdp
  assert per_device_bytes(embed) * (1 if mesh == "data2_expert4" else 4) == embed.nbytes


@pytest.mark.parametrize(
  "section,key,value,message",
  [
    (
      "mesh",
      "data",
      3,
      r"the mesh \(mesh.data=3, mesh.fsdp=1, mesh.expert=4, mesh.tensor=1\) "
      r"has 12 devices but 8 are available",
    ),
    ("mesh", "expert", 3, r"mesh.data=-1 cannot fill the 8 devices"),
    ("mesh", "expert", 16, r"mesh.data=-1 cannot fill the 8 devices"),
    (
      "model.moe",
      "num_experts",
      6,
      r"model.moe.num_experts=6 is not divisible by the "
      r"expert axis \(expert=4\)",
    ),
    (
      "sharding.rules",
      "embed",
      "fsdp,experts",
      r"sharding.rules.embed='fsdp,experts': "
      r"'experts' is not a mesh axis",
    ),
    ("data", "batch_size", 12, r"data.batch_size=12 is not divisible by the 8 batch shards"),
    ("sharding", "all_to_all", "nccl", r"sharding.all_to_all='nccl' is not known"),
  ],
)
def test_bad_mesh_input_is_rejected_before_compilation(
  data_dir, tmp_path, monkeypatch, section, key, value, message
):
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


# Where every parameter of the tiny LM lands on fsdp2_expert2_tensor2, written out:
# (path suffix, shape, spec). The k / v kernels are [32, 16] (1 kv head x 16): their
# kv_heads dimension divides by the tensor axis, so a wrong kv_heads rule moves them.
PLACEMENT = [
  ("attn/k/kernel", (32, 16), P("fsdp", "tensor")),
  ("attn/v/kernel", (32, 16), P("fsdp", "tensor")),
  ("attn/q/kernel", (32, 32), P("fsdp", "tensor")),
  ("attn/o/kernel", (32, 32), P("tensor", "fsdp")),
  ("attn_norm/scale", (32,), P(None)),
  ("ffn_norm/scale", (32,), P(None)),
  ("experts/w_gate", (8, 32, 32), P("expert", "fsdp", "tensor")),
  ("experts/w_up", (8, 32, 32), P("expert", "fsdp", "tensor")),
  ("experts/w_down", (8, 32, 32), P("expert", "tensor", "fsdp")),
  ("ffn/router_kernel", (32, 8), P("fsdp", None)),
  ("embed", (256, 32), P("tensor", "fsdp")),
  ("final_norm/scale", (32,), P(None)),
  ("head/kernel", (32, 256), P("fsdp", "tensor")),
]


def path_str(path):
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def expected_spec(path):
  matches = [(shape, spec) for suffix, shape, spec in PLACEMENT if path.endswith(suffix)]
  assert len(matches) == 1, path
  return matches[0]


def assert_lands(array, mesh, shape, spec, what):
  """`array` has `shape` and each device holds exactly the block `spec` gives it."""
  assert array.shape == shape, what
  want = NamedSharding(mesh, spec).devices_indices_map(shape)
  got = array.sharding.devices_indices_map(shape)
  assert got == want, (what, array.sharding.spec, spec)
  for shard in array.addressable_shards:
    assert shard.data.shape == tuple(
      len(range(*i.indices(n))) for i, n in zip(shard.index, shape)
    ), what


def test_parameters_and_adam_moments_land_where_their_rules_say():
  layout, placement, state = placed_state("fsdp2_expert2_tensor2")
  adam = state.opt_state[1][0]
  seen = 0
  for tree, name in ((state.params, "param"), (adam.mu, "mu"), (adam.nu, "nu")):
    for path, array in jax.tree_util.tree_leaves_with_path(tree):
      shape, spec = expected_spec(path_str(path))
      assert_lands(array, layout.mesh, shape, spec, f"{name} {path_str(path)}")
      seen += 1
  assert seen == 3 * 23  # every parameter of the tiny LM, and both moments of each
  # the batch: rows over data x fsdp x expert (1 x 2 x 2), replicated over tensor
  tokens = jax.device_put(np.zeros(placement.batch_shape, np.int32), placement.batch)
  assert_lands(tokens, layout.mesh, (8, 32), P(("data", "fsdp", "expert"), None), "batch")
