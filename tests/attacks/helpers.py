"""A tiny video MoE classifier trained a few steps on moving digits shrunk to 4 frames
of 8x8 (every other frame, row and column: one pixel of motion per frame), and its
test clips labelled by its own clean predictions (clean accuracy 1, so robust accuracy
is the fraction of predictions an attack leaves unchanged)."""

import functools

import jax.numpy as jnp
import ml_collections
from flax import nnx

from moejax.data.moving_digits import moving_digits
from moejax.models.vit import VisionTransformer
from moejax.train.adversarial import train_classifier
from tests.vision.test_vit_model import tiny_model_cfg

FRAMES = 4


def shrink(videos):
  return videos[:, ::2, ::2, ::2]


def untrained(seed=0):
  m = tiny_model_cfg(**{"vit.frames": FRAMES, "vit.pooling": "mean", "vit.num_classes": 8})
  return VisionTransformer(ml_collections.FrozenConfigDict(m), rngs=nnx.Rngs(seed))


@functools.cache
def trained_model_and_clips(steps=150, count=48):
  """(model, clips [count, 4, 8, 8, 1], its clean predictions)."""
  videos, labels = moving_digits("train", 512, seed=0)
  model = train_classifier(
    untrained(), shrink(videos), labels, steps=steps, batch=32, learning_rate=1e-2, seed=0
  )
  clips = jnp.asarray(shrink(moving_digits("test", count, seed=0)[0]))
  return model, clips, jnp.argmax(model(clips)[0], axis=-1)


def accuracy(model, x, y) -> float:
  return float(jnp.mean(jnp.argmax(model(x)[0], axis=-1) == y))
