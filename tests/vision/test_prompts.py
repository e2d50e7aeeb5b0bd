"""Oracles for the prompt adapters (moejax/adapters/) in the ViT: VAPT's prompts are 0 at
initialisation and input-dependent after one step while VPT's are constants, parameter
counts by hand from the shapes, the prompted forward against the sequence built by hand,
the depthwise convolution against a numpy loop over the grid, and train.trainable
freezing every other parameter bit for bit."""

import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from moejax.adapters import ADAPTERS
from moejax.adapters.vapt import depthwise_conv
from moejax.config import base_config
from moejax.configs import vit_digits_moe
from moejax.errors import ConfigError
from moejax.models.decoder import stack_layers
from moejax.models.vit import VisionTransformer, validate_vit
from moejax.train import optimizer as optimizer_lib
from moejax.train import step as step_lib
from tests.helpers import set_key

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

BATCH, GRID = 3, 4  # 8x8 images in 2x2 patches: a 4x4 patch grid


def prompted_cfg(adapter, *, d=16, layers=2, tokens=3, pooling="cls", hidden=4, scan=False):
  """A dense ViT of width d on 8x8x1 images with `tokens` prompt slots of `adapter`."""
  m = base_config().model
  m.scan_layers = scan
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim = d, layers, 4, 2, 8
  m.d_ff, m.ffn_type = 24, "dense"
  m.vit.pooling = pooling
  m.vit.prompt.adapter, m.vit.prompt.num_tokens = adapter, tokens
  m.vit.prompt.vapt.mlp_hidden = hidden
  return ml_collections.FrozenConfigDict(m)


def build(m, seed=0):
  return VisionTransformer(m, rngs=nnx.Rngs(seed))


def images(seed=0):
  return jax.random.uniform(jax.random.key(seed), (BATCH, 8, 8, 1), jnp.float32)


def patches(seed, d=16):
  return jax.random.normal(jax.random.key(seed), (BATCH, GRID * GRID, d), jnp.float32)


def sgd_step(model, lr=0.5):
  """The model after one plain gradient step of cross-entropy on a batch."""
  graphdef, params, rest = step_lib.split_model(model)
  labels = jnp.arange(BATCH) % 10

  def loss(p):
    logits, _, _ = nnx.merge(graphdef, p, rest)(images(1))
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  grads = jax.grad(loss)(params)
  return nnx.merge(graphdef, jax.tree.map(lambda p, g: p - lr * g, params, grads), rest)


@pytest.mark.integration
def test_vapt_prompts_are_zero_at_init_and_input_dependent_after_one_step():
  model = build(prompted_cfg("vapt"))
  for layer in range(2):
    np.testing.assert_array_equal(np.asarray(model.prompt(layer, patches(0))), 0.0)
  stepped = sgd_step(model)
  for layer in range(2):
    a, b = (np.asarray(stepped.prompt(layer, patches(seed))) for seed in (0, 1))
    assert np.abs(a).max() > 0 and np.abs(a - b).max() > 1e-6


def test_vpt_deep_prompts_are_the_same_for_every_input():
  stepped = sgd_step(build(prompted_cfg("vpt_deep")))
  for layer in range(2):
    a, b = (np.asarray(stepped.prompt(layer, patches(seed))) for seed in (0, 1))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[0], a[1])


def parameter_count(module) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


def test_vapt_has_fewer_parameters_than_vpt_deep_at_equal_prompt_count():
  d, layers, n, k, hidden = 32, 4, 8, 2, 4
  cells = (GRID - k + 1) ** 2  # the 4x4 grid after a valid 2x2 convolution
  vapt_by_hand = layers * (2 * d + k * k + cells * n + n) + 2 * d * hidden  # 848
  vpt_deep_by_hand = layers * n * d  # 1024
  vapt = build(prompted_cfg("vapt", d=d, layers=layers, tokens=n, hidden=hidden)).prompt
  vpt_deep = build(prompted_cfg("vpt_deep", d=d, layers=layers, tokens=n)).prompt
  assert parameter_count(vapt) == vapt_by_hand == 848
  assert parameter_count(vpt_deep) == vpt_deep_by_hand == 1024
  assert parameter_count(build(prompted_cfg("vpt_shallow", d=d, tokens=n)).prompt) == n * d


def by_hand(model, x, prompts_per_block, prefix):
  """The ViT on the sequence built by hand: prompts_per_block[i] ([N, d], or None to keep
  the slots) written after the first `prefix` tokens before block i, dropped at the end."""
  h = model.embed(x)
  allowed = jnp.ones((1, 1, 1), bool)
  n = 0
  for i, block in enumerate(model.blocks):
    if prompts_per_block[i] is not None:
      p = jnp.broadcast_to(prompts_per_block[i], (h.shape[0], *prompts_per_block[i].shape))
      h = jnp.concatenate([h[:, :prefix], p, h[:, prefix + n :]], axis=1)
      n = p.shape[1]
    h, _, _ = block(
      h, None, allowed, None, None, 0, train=False, rng=jax.random.fold_in(jax.random.key(0), i)
    )
  h = model.final_norm(jnp.concatenate([h[:, :prefix], h[:, prefix + n :]], axis=1))
  pooled = h[:, 0] if prefix else jnp.mean(h, axis=1)
  return model.head(pooled).astype(jnp.float32)


@pytest.mark.parametrize(
  "adapter, pooling", list(itertools.product(["vpt_shallow", "vpt_deep", "vapt"], ["cls", "mean"]))
)
def test_the_prompted_vit_is_the_plain_vit_on_the_sequence_built_by_hand(adapter, pooling):
  model = build(prompted_cfg(adapter, pooling=pooling))
  prefix = int(pooling == "cls")
  tokens = {
    "vpt_shallow": lambda: [model.prompt.tokens[0], None],
    "vpt_deep": lambda: list(model.prompt.tokens[...]),
    "vapt": lambda: [jnp.zeros((3, 16))] * 2,
  }[adapter]()  # VAPT: 0 at init
  logits, _, _ = model(images())
  np.testing.assert_allclose(logits, by_hand(model, images(), tokens, prefix), rtol=1e-5, atol=1e-6)
  # The slots take part in the attention: even prompts of 0 change the logits.
  plain = by_hand(model, images(), [None, None], prefix)
  assert np.abs(np.asarray(logits - plain)).max() > 1e-4


def test_vpt_shallow_over_scanned_blocks_computes_the_loop_model():
  """Scanned blocks holding the loop model's parameters stacked (the decoder's scale
  skeleton: stack_layers) compute the loop model; the first block's prompts enter
  before the scan."""
  loop, scanned = (build(prompted_cfg("vpt_shallow", scan=scan)) for scan in (False, True))
  _, params, rest = stack_layers(loop.cfg, *step_lib.split_model(loop)[1:])
  scanned = nnx.merge(nnx.graphdef(scanned), params, rest)
  np.testing.assert_allclose(scanned(images())[0], loop(images())[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel, padding", [(2, 0), (3, 0), (3, 1)])
def test_the_depthwise_conv_is_the_numpy_loop_over_the_grid(kernel, padding):
  rng = np.random.default_rng(0)
  grid = rng.standard_normal((2, 5, 5, 3)).astype(np.float32)
  k = rng.standard_normal((kernel, kernel)).astype(np.float32)
  padded = np.pad(grid, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  side = 5 + 2 * padding - kernel + 1
  want = np.zeros((2, side, side, 3), np.float32)
  for b, r, c, ch in itertools.product(range(2), range(side), range(side), range(3)):
    want[b, r, c, ch] = sum(
      k[u, v] * padded[b, r + u, c + v, ch] for u in range(kernel) for v in range(kernel)
    )
  got = depthwise_conv(jnp.asarray(grid), jnp.asarray(k), padding)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def flat(params) -> dict:
  return {
    "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
    for path, v in jax.tree_util.tree_leaves_with_path(params)
  }


@pytest.mark.integration
@pytest.mark.parametrize(
  "trainable, trained, moved",
  [
    ("prompt", ("prompt/", "head/"), ("prompt/", "head/")),
    ("head", ("head/",), ("head/",)),
    ("all", ("",), ("prompt/", "head/", "blocks/", "patch_embed/", "position")),
  ],
)
def test_trainable_updates_only_its_parameters_bit_for_bit(trainable, trained, moved):
  t = base_config().train
  t.trainable, t.warmup_steps, t.steps, t.learning_rate = trainable, 0, 10, 1e-2
  graphdef, params, rest = step_lib.split_model(build(prompted_cfg("vapt")))
  optimizer = optimizer_lib.make_optimizer(t)

  def loss(p):
    logits, _, _ = nnx.merge(graphdef, p, rest)(images(1))
    return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(BATCH)).mean()

  updates, _ = optimizer.update(jax.grad(loss)(params), optimizer.init(params), params)
  before, after = flat(params), flat(optax.apply_updates(params, updates))
  for name in before:  # frozen: bit for bit
    if not name.startswith(trained):
      np.testing.assert_array_equal(before[name], after[name], err_msg=name)
  # trained: each group moves (at VAPT's init only its token projection has a gradient)
  changed = [name for name in before if np.any(before[name] != after[name])]
  assert all(any(name.startswith(group) for name in changed) for group in moved), changed


def digits_cfg(**changes):
  c = vit_digits_moe.get_config()
  c.model.scan_layers = False
  for key, value in changes.items():
    set_key(c, key, value)
  return c


@pytest.mark.parametrize(
  "changes, names",
  [
    ({"model.vit.prompt.adapter": "vpt_wide"}, ["model.vit.prompt.adapter='vpt_wide'", "vapt"]),
    ({"model.vit.prompt.depth": 2}, ["model.vit.prompt", "'depth'"]),
    ({"model.vit.prompt.vapt.kernal": 2}, ["model.vit.prompt.vapt", "'kernal'", "'kernel'"]),
    ({"model.vit.prompt.num_tokens": 0}, ["model.vit.prompt.num_tokens=0"]),
    (
      {"model.vit.prompt.adapter": "vapt", "model.vit.prompt.vapt.kernel": 6},
      ["model.vit.prompt.vapt.kernel=6", "4x4"],
    ),
    (
      {"model.vit.prompt.adapter": "vpt_deep", "model.scan_layers": True},
      ["model.vit.prompt.adapter='vpt_deep'", "model.scan_layers=False"],
    ),
    ({"train.trainable": "prompt"}, ["train.trainable='prompt'", "model.vit.prompt.adapter"]),
  ],
)
def test_bad_prompt_settings_are_refused_in_one_line_naming_the_key(changes, names):
  c = digits_cfg()
  with c.unlocked():
    c.model.vit.prompt.update({})
    for key, value in changes.items():
      node, _, leaf = key.rpartition(".")
      section = c
      for part in node.split("."):
        section = section[part]
      section[leaf] = value
  with pytest.raises(ConfigError) as error:
    validate_vit(c)
  message = str(error.value)
  assert "\n" not in message and all(name in message for name in names), message


def test_every_registered_adapter_validates_with_its_defaults():
  for name, _ in ADAPTERS.items():
    validate_vit(digits_cfg(**{"model.vit.prompt.adapter": name}))


@pytest.mark.parametrize("trainable", ["prompt", "head"])
def test_prompt_or_head_tuning_of_a_decoder_is_refused_naming_the_key(trainable):
  from moejax.validation import validate_task

  c = base_config()
  c.train.trainable = trainable
  with pytest.raises(ConfigError, match=f"train.trainable='{trainable}'.*not 'decoder'"):
    validate_task(c)
