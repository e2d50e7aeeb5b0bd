"""The space-time ViT (moejax/models/vit.py, model.vit.frames): a clip's patches are
every frame's patches in frame order; frames = 1 is the image model (a clip of one
frame gives the image's logits, bit for bit, with the same weights); a clip model sees
time (reversing the frames changes its logits) yet, with mean pooling, permuting
tokens with their space-time positions does not; frames < 1 is refused naming the key."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.config import base_config
from moejax.errors import ConfigError
from moejax.models.vit import VisionTransformer, num_tokens, patchify, validate_vit
from tests.vision.test_vit_model import tiny_model_cfg

FRAMES = 4


def build(m, seed=0):
  return VisionTransformer(ml_collections.FrozenConfigDict(m), rngs=nnx.Rngs(seed))


def clips(seed=0, batch=2, frames=FRAMES):
  return jax.random.uniform(jax.random.key(seed), (batch, frames, 8, 8, 1), jnp.float32)


def test_clip_patches_are_each_frames_patches_in_frame_order():
  x = clips()
  patches = patchify(x, 2)
  assert patches.shape == (2, FRAMES * 16, 4)
  for t in range(FRAMES):
    np.testing.assert_array_equal(patches[:, t * 16 : (t + 1) * 16], patchify(x[:, t], 2))


def test_one_frame_is_the_image_model_with_the_same_weights():
  old = tiny_model_cfg()
  del old.vit["frames"]  # a stored config from before the key: the image model
  image_model, clip_model = build(old, seed=0), build(tiny_model_cfg(**{"vit.frames": 1}), seed=1)
  nnx.update(clip_model, nnx.state(image_model))
  x = clips(frames=1)
  image_logits, _, _ = image_model(x[:, 0])
  clip_logits, _, _ = clip_model(x)
  np.testing.assert_array_equal(np.asarray(clip_logits), np.asarray(image_logits))
  assert num_tokens(clip_model.cfg) == num_tokens(image_model.cfg) == 17


def test_the_clip_model_sees_time_but_not_token_order():
  m = tiny_model_cfg(**{"vit.frames": FRAMES, "vit.pooling": "mean"})
  model = build(m)
  assert model.position.shape == (FRAMES * 16, 16)
  x = clips()
  logits, _, _ = model(x)
  reversed_logits, _, _ = model(x[:, ::-1])
  assert np.max(np.abs(np.asarray(logits - reversed_logits))) > 1e-3
  # frames reversed together with their rows of the space-time position embedding
  positions = model.position[...].reshape(FRAMES, 16, 16)
  model.position[...] = positions[::-1].reshape(FRAMES * 16, 16)
  swapped, _, _ = model(x[:, ::-1])
  np.testing.assert_allclose(np.asarray(swapped), np.asarray(logits), rtol=1e-5, atol=1e-5)


def test_a_clip_of_the_wrong_length_is_refused():
  model = build(tiny_model_cfg(**{"vit.frames": FRAMES}))
  with pytest.raises(ValueError, match="model.vit.frames=4"):
    model(clips(frames=3))


@pytest.mark.parametrize("frames", [0, -1])
def test_frames_below_one_is_a_config_error_naming_the_key(frames):
  c = base_config()
  c.model_name, c.task = "vit", "classification"
  c.model.attention.windows = []
  c.model.vit.frames = frames
  with pytest.raises(ConfigError, match=r"^model\.vit\.frames=.* must be an int >= 1$"):
    validate_vit(c)
