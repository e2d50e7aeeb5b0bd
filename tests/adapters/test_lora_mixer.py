"""LoRA-Mixer (model.attention.adapter='lora_mixer', moejax/adapters/lora_mixer.py):
B = 0 is the frozen base exactly; only the adapter (or only its routers) is updated;
the straight-through forward is the hard top-k routing (a float64 per-token loop)
while the router's gradient is the soft mixture's; bad settings are refused naming
the key; and it runs on an imported HF checkpoint with the base's logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.adapters.lora_mixer import SETTINGS, LoRAMixer, straight_through_gates
from moejax.adapters.projection import with_adapter_params, without_adapter
from moejax.config import base_config
from moejax.errors import ConfigError
from moejax.models.decoder import Decoder, abstract_model
from moejax.train.optimizer import make_optimizer
from moejax.train.step import make_grad_fn, split_model
from moejax.validation import validate_config

ADAPTER_PARAMS = {"lora_a", "lora_b", "router_kernel"}
KEY = r"model\.attention\.lora_mixer\."


def lora_mixer_config(**adapter):
  c = base_config()
  m = c.model
  m.vocab_size, m.d_model, m.num_layers, m.d_ff = 32, 16, 1, 32
  m.num_heads, m.num_kv_heads, m.head_dim = 2, 1, 8
  m.ffn_type = "dense"
  m.attention.adapter = "lora_mixer"
  m.attention.lora_mixer.update(dict(num_experts=3, top_k=1, rank=2, **adapter))
  c.train.warmup_steps = 0
  return c


def flat(tree) -> dict:
  items = nnx.traversals.flatten_mapping(tree).items()
  return {tuple(map(str, k)): np.asarray(v) for k, v in items}


def with_random_b(params, seed=0):
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
    lambda path, x: (
      jnp.asarray(rng.standard_normal(x.shape), x.dtype)
      if str(getattr(path[-1], "key", "")) == "lora_b"
      else x
    ),
    params,
  )


def tokens(batch=2, length=7, vocab=32, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (batch, length)), jnp.int32)


@pytest.mark.integration
@pytest.mark.parametrize(
  "projections, where",
  [("q,k,v,o", "attn"), ("gate,up,down", "ffn"), ("q,up", "attn+ffn")],
  ids=["attention", "ffn", "both"],
)
def test_zero_b_is_the_frozen_base_exactly(projections, where):
  c = lora_mixer_config(projections=projections)
  base_graphdef, base_params, base_rest = split_model(
    Decoder(without_adapter(c.model), rngs=nnx.Rngs(0))
  )
  graphdef, fresh, rest = split_model(Decoder(c.model, rngs=nnx.Rngs(1)))
  params = with_adapter_params(base_params, fresh)
  added = set(flat(params)) - set(flat(base_params))
  assert added and all("adapter" in path and path[-1] in ADAPTER_PARAMS for path in added)
  owners = {
    path[path.index("adapter") - 1] + "/" + path[path.index("adapter") + 1] for path in added
  }
  module = {"q": "attn", "k": "attn", "v": "attn", "o": "attn"}
  assert owners == {f"{module.get(p, 'ffn')}/{p}" for p in projections.split(",")}, where
  x = tokens()
  want = nnx.merge(base_graphdef, base_params, base_rest)(x)[0]
  logits, aux, _ = nnx.merge(graphdef, params, rest)(x)
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(want))
  assert [sorted(a["projections"]) for a in aux["adapters"]] == [sorted(projections.split(","))]
  assert float(aux["aux_loss"]) > 0  # RSL at weight 0.01 on every projection's router
  moved = nnx.merge(graphdef, with_random_b(params), rest)(x)[0]
  assert np.abs(np.asarray(moved) - np.asarray(want)).max() > 1e-3  # B != 0: not the base


def test_ffn_experts_add_their_terms_to_gate_up_and_down_of_the_swiglu():
  """The dense FFN with LoRA experts on gate/up/down against SwiGLU written out in
  float64 with each projection's adapter term (the adapter modules' own outputs)
  added where the projection's output is: down(silu(Wg x + Tg(x)) * (Wu x + Tu(x)))
  plus Td of that hidden state."""
  c = lora_mixer_config(projections="gate,up,down")
  graphdef, params, rest = split_model(Decoder(c.model, rngs=nnx.Rngs(0)))
  model = nnx.merge(graphdef, with_random_b(params), rest)
  ffn = model.blocks[0].ffn
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 5, 16)), jnp.float32)
  got, aux = ffn.adapted(x, None)

  def weight(name):
    return np.asarray(getattr(ffn, name).kernel[...], np.float64)

  def term(name, v):
    return np.asarray(ffn.adapter[name](jnp.asarray(v, jnp.float32), None)[0], np.float64)

  x64 = np.asarray(x, np.float64)
  gate, up = x64 @ weight("gate") + term("gate", x64), x64 @ weight("up") + term("up", x64)
  hidden = gate / (1 + np.exp(-gate)) * up
  want = hidden @ weight("down") + term("down", hidden)
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-5)
  assert sorted(aux["projections"]) == ["down", "gate", "up"]


def test_ffn_projections_on_a_model_without_a_dense_ffn_are_refused():
  c = lora_mixer_config(projections="q,gate")
  c.model.ffn_type = "moe"
  with pytest.raises(ConfigError, match=KEY + r"projections='q,gate' names FFN projections"):
    validate_config(c)


@pytest.fixture(scope="module")
def training_gradients():
  """(params with B != 0, their gradients of the training loss, its metrics): B = 0
  would leave A and the router without gradient."""
  c = lora_mixer_config()
  graphdef, params, rest = split_model(Decoder(c.model, rngs=nnx.Rngs(0)))
  params = with_random_b(params)
  x = tokens(length=9)
  batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
  grads, metrics, _ = jax.jit(make_grad_fn(graphdef))(params, rest, batch, jax.random.key(0))
  return params, grads, metrics


@pytest.mark.parametrize(
  "trainable,trained", [("adapter", ADAPTER_PARAMS), ("adapter_router", {"router_kernel"})]
)
def test_only_the_adapter_is_updated(trainable, trained, training_gradients):
  """One optimizer step on the training loss: nonzero updates exactly on the adapter's
  LoRAs and routers ('adapter') or its routers ('adapter_router'), zero elsewhere,
  though the base's gradients are not zero."""
  params, grads, metrics = training_gradients
  c = lora_mixer_config()
  c.train.trainable = trainable
  validate_config(c)
  assert float(metrics["aux_loss"]) > 0
  optimizer = make_optimizer(c.train)
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  grads, updates = flat(grads), flat(updates)
  assert any(np.abs(g).max() > 0 for p, g in grads.items() if "adapter" not in p)
  for path, update in updates.items():
    if "adapter" in path and path[-1] in trained:
      assert np.abs(update).max() > 0, path
    else:
      assert not np.any(update), path


@pytest.mark.integration
@pytest.mark.parametrize("top_k", [1, 2])
def test_straight_through_forward_is_hard_routing_and_its_gradient_the_soft_one(top_k):
  d_in, d_out, e, r, t, scale = 6, 5, 3, 2, 9, 0.5
  settings = {**SETTINGS, "num_experts": e, "top_k": top_k, "rank": r, "scale": scale}
  mixer = LoRAMixer(
    d_in, d_out, (None, None), settings, base_config().model, rngs=nnx.Rngs(0), dtype=jnp.float32
  )
  rng = np.random.default_rng(top_k)
  mixer.lora_b.set_value(jnp.asarray(rng.standard_normal((e, r, d_out)), jnp.float32))
  mixer.router_kernel.set_value(jnp.asarray(rng.standard_normal((d_in, e)), jnp.float32))
  x = rng.standard_normal((1, t, d_in)).astype(np.float32)
  term, _ = mixer(jnp.asarray(x))

  a, b, w = (
    np.asarray(v[...], np.float64) for v in (mixer.lora_a, mixer.lora_b, mixer.router_kernel)
  )
  want = np.zeros((t, d_out))
  for i, row in enumerate(x[0].astype(np.float64)):
    logits = row @ w
    chosen = np.argsort(-logits, kind="stable")[:top_k]  # softmax keeps the order
    want[i] = scale * sum(row @ a[j] @ b[j] for j in chosen) / top_k
  np.testing.assert_allclose(np.asarray(term[0]), want, rtol=1e-5, atol=1e-5)
  gates = straight_through_gates(mixer.route(jnp.asarray(x[0])))
  hard = np.zeros((t, e), np.float32)
  for i, row in enumerate(x[0].astype(np.float64)):
    hard[i, np.argsort(-(row @ w), kind="stable")[:top_k]] = 1.0 / top_k
  np.testing.assert_array_equal(np.asarray(gates), hard)  # forward: the hard gates exactly

  cotangent = jnp.asarray(rng.standard_normal((t, d_out)), jnp.float32)
  graphdef, state = nnx.split(mixer)

  def straight_through(state):
    return jnp.sum(nnx.merge(graphdef, state)(jnp.asarray(x))[0][0] * cotangent)

  got = nnx.to_pure_dict(jax.grad(straight_through)(state))["router_kernel"]
  lora = jnp.einsum("td,edr,erf->tef", jnp.asarray(x[0]), mixer.lora_a[...], mixer.lora_b[...])

  def soft_mixture(router):
    probs = jax.nn.softmax(jnp.asarray(x[0]) @ router, axis=-1)
    return jnp.sum(scale * jnp.einsum("te,tef->tf", probs, lora) * cotangent)

  soft = jax.grad(soft_mixture)(mixer.router_kernel[...])
  assert np.abs(np.asarray(got)).max() > 1e-3
  np.testing.assert_allclose(np.asarray(got), np.asarray(soft), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("top_k", 4, KEY + r"top_k=4 exceeds " + KEY + r"num_experts=3"),
    ("rank", 0, KEY + r"rank=0 must be an int >= 1"),
    ("rank", 9, KEY + r"rank=9 exceeds 8, the smallest dimension"),
    ("projections", "q,x", KEY + r"projections='q,x' must name"),
    ("loss_weights", {"nope": 1.0}, KEY + r"loss_weights='nope' is not known"),
  ],
)
def test_bad_settings_are_refused_in_one_line_naming_the_key(key, value, message):
  c = lora_mixer_config()
  c.model.attention.lora_mixer[key] = value
  with pytest.raises(ConfigError, match=f"^{message}") as failure:
    validate_config(c)
  assert "\n" not in str(failure.value)


def test_bad_choices_around_the_adapter_are_refused():
  c = lora_mixer_config()
  c.model.attention.adapter = "lora_mixr"
  with pytest.raises(ConfigError, match=r"^model\.attention\.adapter='lora_mixr' is not known"):
    validate_config(c)
  c = base_config()
  c.train.trainable = "adapter"
  with pytest.raises(ConfigError, match=r"^train\.trainable='adapter' trains an attention adapter"):
    validate_config(c)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
  from tests.interop.hf_tiny import make_model, save_model

  return save_model(make_model("qwen3_moe", vocab_size=256), str(tmp_path_factory.mktemp("hf")))


@pytest.mark.integration
def test_on_an_imported_hf_checkpoint(qwen3_dir):
  """configs/lora_mixer.py on a tiny transformers Qwen3-MoE: the resolved model is the
  checkpoint's plus the adapter, and its first state has the checkpoint's weights, the
  adapter's (B = 0) beside them, and the checkpoint's logits."""
  from moejax.configs import lora_mixer
  from moejax.interop.convert import import_hf
  from moejax.train import init_from
  from moejax.train.build import init_state

  c = lora_mixer.get_config("family=qwen3_moe,steps=3")
  c.init.hf_dir = qwen3_dir
  validate_config(c)
  config = init_from.resolve_config(c)
  assert config.model.attention.adapter == "lora_mixer" and config.model.family == "qwen3_moe"
  graphdef, state, optimizer = init_state(config)
  start = init_from.initial_state(config, state, optimizer)
  theirs = import_hf(qwen3_dir)
  ours = flat(start.params)
  for path, value in flat(theirs.params).items():
    np.testing.assert_array_equal(ours[path], value)
  x = tokens(vocab=256, length=9)
  want = nnx.merge(abstract_model(theirs.config)[0], theirs.params, theirs.rest)(x)[0]
  got = nnx.merge(graphdef, start.params, start.rest)(x)[0]
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  added = set(ours) - set(flat(theirs.params))
  assert {path[-1] for path in added} == ADAPTER_PARAMS and all("adapter" in p for p in added)
  assert not any(np.any(ours[p]) for p in added if p[-1] == "lora_b")


@pytest.mark.integration
def test_ffn_experts_on_an_all_moe_checkpoint_are_refused_when_its_model_is_read(qwen3_dir):
  """With init.hf_dir the model that trains is the directory's: the config's placeholder
  passes validation, and the FFN place is refused once the checkpoint (every block an
  MoE layer) is read, in one line naming the key."""
  from moejax.configs import lora_mixer
  from moejax.train import init_from

  c = lora_mixer.get_config("family=qwen3_moe,steps=3,place=ffn")
  c.init.hf_dir = qwen3_dir
  validate_config(c)
  with pytest.raises(ConfigError, match=KEY + r"projections='gate,up,down' names FFN") as e:
    init_from.resolve_config(c)
  assert "\n" not in str(e.value)
