"""Class-incremental prompt learning on a frozen ViT: SMoPE (arXiv 2509.24483,
moejax/adapters/smope.py) against one shared prompt and task-specific prompts with key
matching, on a class-incremental stream of the digits (moejax/data/class_stream.py).

Per seed: a ViT backbone is pretrained without labels on one half of the training
images (predicting which of 4 rotations was applied, Gidaris et al. 2018), then frozen;
the stream uses the other half, so no class label reaches the backbone. Every method
trains only its prompts and the head, task after task, on the current task's classes
(the logits of the other classes masked out, as the official code trains), and is
evaluated after each task on the test images of every task seen so far, over the
classes seen so far. The prediction is the nearest class mean (cosine) of the
prompted feature, each class's mean taken on its training images when its task
ends; the head's own prediction is reported beside it (head_*). The official code
instead re-aligns the head on features drawn from stored class Gaussians (its
crct_epochs); both keep the linear head's bias toward the latest task out of the
comparison of prompts, which is what the class means do here.

  smope         N experts in the first blocks' attention, top-K by the proxy score,
                the official usage rules (count after each task, penalise frequent
                experts in training, exclude never-used ones in evaluation), and the
                official dense warm-up: the first task's first `warmup` steps use all
                experts; the official margin router loss and old-key prototype loss
                (weights 1e-5) in the training loss.
  smope_no_usage  the same without the usage rules (both penalties 0; the router loss's
                margin is the penalty, so 0 too).
  smope_no_router_losses  smope without the official router and old-key losses.
  shared        one prefix of N experts, all used by every input, per-query logits
                (dense prefix tuning; the same prompt parameters as smope).
  task_prompts  T prefixes of N / T experts, task t's trained on task t only, with
                per-query logits; at test time the prefix of the task whose key is
                closest (cosine) to the frozen backbone's feature of the image
                (L2P / DualPrompt key matching; the key is the normalised mean of
                the task's normalised features, the minimiser of L2P's sum of
                1 - cos, so it needs no training).

accuracy[t][j]: accuracy on task j's test images after training task t (j <= t).
Final average accuracy mean_j accuracy[T-1][j]; forgetting mean over j < T - 1 of
max_{t < T-1} accuracy[t][j] - accuracy[T-1][j] (Chaudhry et al. 2018).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from moejax.config import base_config
from moejax.data.class_stream import class_incremental_tasks, shuffled_class_order, task_rows
from moejax.data.vision import VISION_DATASETS, read_split
from moejax.data.storage import resolve_data_dir
from moejax.models.vit import VisionTransformer
from moejax.train.classifier import MASKED, batches, trained_steps
from moejax.train.optimizer import make_optimizer

METHODS = ("smope", "smope_no_usage", "smope_no_router_losses", "shared", "task_prompts")
ROTATIONS = 4


@dataclasses.dataclass(frozen=True)
class Setup:
  """The model and the schedule (a study's settings, moejax/studies/scorers/smope.py).

  experts N and top_k K of SMoPE; blocks with prompt experts (0: the first half);
  warmup: SMoPE's dense steps at the start of the first task; lr: Adam's, for the
  prompts and the head, reset per task."""

  d_model: int
  layers: int
  heads: int
  head_dim: int
  d_ff: int
  experts: int
  top_k: int
  blocks: int
  pretrain_steps: int
  pretrain_lr: float
  steps_per_task: int
  warmup: int
  batch: int
  lr: float


def digits(data_dir=None):
  """(train images, train labels, test images, test labels) of the digits, in [0, 1]."""
  dataset = VISION_DATASETS["digits"]
  builder = dataset.prepare(resolve_data_dir(data_dir))
  cfg = ml_collections.ConfigDict(dict(name="digits", train_split="train", eval_split="test"))
  train = read_split(builder, cfg, "train_split", dataset.pixel_max)
  test = read_split(builder, cfg, "eval_split", dataset.pixel_max)
  return (*train, *test)


def model_config(s: Setup, num_classes: int, method: str | None = None, tasks: int = 1):
  """The ViT's model section: no adapter (method None) or SMoPE's module as `method`."""
  m = base_config().model
  m.scan_layers = False
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads = s.d_model, s.layers, s.heads, s.heads
  m.head_dim, m.d_ff, m.ffn_type = s.head_dim, s.d_ff, "dense"
  m.vit.update(dict(image_size=8, patch_size=2, num_channels=1, num_classes=num_classes))
  if method is not None:
    m.vit.prompt.adapter, m.vit.prompt.num_tokens = "smope", s.experts
    p = m.vit.prompt.smope
    p.blocks = s.blocks
    p.top_k = s.top_k if method.startswith("smope") else s.experts
    p.proxy_logits = method.startswith("smope")
    if method == "smope_no_usage":
      p.penalty, p.unused_penalty = 0.0, 0.0
    if method == "smope_no_router_losses":
      p.router_weight, p.old_key_weight = 0.0, 0.0
    if method == "task_prompts":
      m.vit.prompt.num_tokens = s.experts // tasks * tasks
  return ml_collections.FrozenConfigDict(m)


def rotated(images, rng):
  """(images each rotated by k * 90 degrees, k) with k uniform in 0..3."""
  k = rng.integers(0, ROTATIONS, len(images))
  return np.stack([np.rot90(x, int(r), axes=(0, 1)) for x, r in zip(images, k)]), k


def pretrain_backbone(s: Setup, images, seed: int) -> VisionTransformer:
  """The ViT trained to tell the rotation of `images` (module doc)."""
  model = VisionTransformer(model_config(s, ROTATIONS), rngs=nnx.Rngs(seed))
  t = base_config().train
  t.steps, t.learning_rate, t.warmup_steps = s.pretrain_steps, s.pretrain_lr, 20
  rng = np.random.default_rng(seed)
  x, k = rotated(images, rng)
  every_class = jnp.ones((ROTATIONS,), bool)
  steps = batches(rng, x, k, s.pretrain_steps, 64, every_class)
  return trained_steps(model, nnx.Param, make_optimizer(t), steps)


BACKBONE = nnx.All(
  nnx.Param, nnx.Not(nnx.Any(nnx.PathContains("head"), nnx.PathContains("prompt")))
)
PROMPT_AND_HEAD = nnx.All(nnx.Param, nnx.Any(nnx.PathContains("head"), nnx.PathContains("prompt")))


def copy_backbone(source, target) -> None:
  """Every parameter of `source` but the head (and prompts) into `target`."""
  nnx.update(target, nnx.state(source, BACKBONE))


def feature_fn(s: Setup, model, method: str | None = None, tasks: int = 1):
  """images -> the pooled, normed feature [B, d] (numpy) of `model` (a ViT of
  model_config(s, ..., method, tasks)): a copy of it with an identity head."""
  probe = VisionTransformer(model_config(s, s.d_model, method, tasks), rngs=nnx.Rngs(0))
  return probed_features(model, probe)


def probed_features(model, probe):
  """images -> the pooled, normed feature [B, d] (numpy) of `model`, read through `probe`:
  a ViT of `model`'s config but a head of d outputs, given every parameter of `model`
  but the head, and an identity head."""
  nnx.update(probe, nnx.state(model, nnx.Not(nnx.PathContains("head"))))
  d = probe.head.kernel[...].shape[0]
  probe.head.kernel[...] = jnp.eye(d)
  assert probe.head.bias is not None  # the ViT's head has a bias
  probe.head.bias[...] = jnp.zeros((d,))
  return lambda x: np.asarray(logits_of(probe, jnp.asarray(x)))


@nnx.jit
def logits_of(model, x):
  return model(x)[0]


def normalised(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def prompt_parameters(model, num_keys: int = 0, d: int = 0) -> int:
  """Trained prompt numbers: the experts' keys and values, plus task keys."""
  state = nnx.state(model.prompt, nnx.Param)
  return int(sum(np.size(x) for x in jax.tree.leaves(state))) + num_keys * d


def forgetting(accuracy) -> float:
  """Mean over tasks j < T - 1 of the best earlier accuracy on j minus the final one."""
  a, last = np.asarray(accuracy), len(accuracy) - 1
  return float(np.mean([np.max(a[j:last, j]) - a[last, j] for j in range(last)]))


def run_stream(method: str, s: Setup, backbone, data, tasks, seed: int) -> dict:
  """Train `method` task after task on the frozen backbone; {"model" (the last one),
  "accuracy" [T, T] (nan above the diagonal; class means), "final_accuracy",
  "forgetting", the same of the head as "head_accuracy", "head_final_accuracy",
  "head_forgetting", "prompt_params", and for task_prompts "task_id_accuracy" (the
  key matching's share of correct tasks on the tasks seen)}."""
  train_x, train_y, test_x, test_y = data
  num_classes, count = int(max(train_y.max(), test_y.max())) + 1, len(tasks)
  model = VisionTransformer(model_config(s, num_classes, method, count), rngs=nnx.Rngs(seed))
  copy_backbone(backbone, model)
  train_rows, test_rows = task_rows(train_y, tasks), task_rows(test_y, tasks)
  rng = np.random.default_rng(seed)
  optimizer = optax.adam(s.lr)
  per_task = model.prompt.num_experts // count
  sparse = method.startswith("smope")
  key_features = feature_fn(s, backbone) if method == "task_prompts" else None
  keys: list[np.ndarray] = []
  means: dict[int, np.ndarray] = {}  # class -> normalised mean feature when learned
  accuracy = {kind: np.full((count, count), np.nan) for kind in ("mean", "head")}
  out: dict = {}
  for t, classes in enumerate(tasks):
    allowed = jnp.isin(jnp.arange(num_classes), jnp.asarray(classes))
    x, y = train_x[train_rows[t]], train_y[train_rows[t]]
    if key_features is not None:
      model.prompt.assign(np.arange(t * per_task, (t + 1) * per_task)[None])
      keys.append(normalised(normalised(key_features(x)).mean(0)))
    if sparse and t == 0 and s.warmup:
      top_k, model.prompt.top_k = model.prompt.top_k, model.prompt.num_experts
      warm = batches(rng, x, y, s.warmup, s.batch, allowed)
      model = trained_steps(model, PROMPT_AND_HEAD, optimizer, warm)
      model.prompt.top_k = top_k
    steps = batches(rng, x, y, s.steps_per_task, s.batch, allowed)
    model = trained_steps(model, PROMPT_AND_HEAD, optimizer, steps, router_losses=sparse)
    if sparse:
      model.prompt.count_selections()
      logits_of(model, jnp.asarray(x))
      model.prompt.count_selections(False)
      model.prompt.end_task()
    learned = normalised(feature_fn(s, model, method, count)(x))
    for c in classes:
      means[c] = normalised(learned[y == c].mean(0))
    if key_features is not None:
      guess = np.argmax(normalised(key_features(test_x)) @ np.stack(keys).T, axis=-1)
      model.prompt.assign(guess[:, None] * per_task + np.arange(per_task))
      truth = np.full(len(test_y), -1)
      for j, rows in enumerate(test_rows):
        truth[rows] = j
      seen_rows = np.concatenate(test_rows[: t + 1])
      out["task_id_accuracy"] = float(np.mean(guess[seen_rows] == truth[seen_rows]))
    seen = sorted(means)
    test_features = normalised(feature_fn(s, model, method, count)(test_x))
    predicted = {
      "mean": np.asarray(seen)[np.argmax(test_features @ np.stack([means[c] for c in seen]).T, -1)],
      "head": np.argmax(
        np.where(np.isin(np.arange(num_classes), seen), logits_of(model, test_x), MASKED),
        axis=-1,
      ),
    }
    for kind, guessed in predicted.items():
      for j in range(t + 1):
        accuracy[kind][t, j] = np.mean(guessed[test_rows[j]] == test_y[test_rows[j]])
  out.update(
    model=model,
    accuracy=accuracy["mean"].tolist(),
    final_accuracy=float(np.mean(accuracy["mean"][-1])),
    forgetting=forgetting(accuracy["mean"]),
    head_accuracy=accuracy["head"].tolist(),
    head_final_accuracy=float(np.mean(accuracy["head"][-1])),
    head_forgetting=forgetting(accuracy["head"]),
    prompt_params=prompt_parameters(model, len(keys), s.d_model),
  )
  return out


def prepared_draw(s: Setup, seed: int, classes_per_task: int, data):
  """(frozen backbone, the stream's (train x, train y, test x, test y), tasks) of one
  seed: the training rows split in half at random, the backbone pretrained on the
  first half's rotations, the class order shuffled."""
  train_x, train_y, test_x, test_y = data
  rows = np.random.default_rng(seed).permutation(len(train_y))
  source, stream = rows[: len(rows) // 2], rows[len(rows) // 2 :]
  backbone = pretrain_backbone(s, train_x[source], seed)
  order = shuffled_class_order(int(train_y.max()) + 1, seed)
  tasks = class_incremental_tasks(order, classes_per_task)
  return backbone, (train_x[stream], train_y[stream], test_x, test_y), tasks
