"""Continual VQA on the Sort-of-CLEVR style stream (moejax/data/sort_of_clevr.py) with the
calibrated Bayesian MoE (ICML 2026, abstract only; moejax/continual/bayesian_moe.py):
per-task LoRA adapters on a frozen ViT in one answer space, routed four ways.

The input: the image's 3 colour channels and the question vector broadcast to every pixel
as 12 more channels (early fusion, our choice: the ViT of moejax/models/vit.py reads
images only), so every patch embedding sees the question. Per draw:

  backbone  the ViT (model.attention.adapter 'lora_mixer' with one LoRA of rank `rank`
            on q, k, v, o: LoRA-Mixer's single-LoRA case, B = 0 so the base exactly)
            trained on `pretrain_rows` "exists" questions of their own split (a guess:
            a stand-in for a pretrained vision-language backbone that no stream task
            trains), then frozen with its head.
  experts   task t (one question type) trains its own LoRA and a copy of the head, from
            the pretrained ones, with Adam on the cross-entropy over ALL answers (the
            unified answer space), on the task's rows minus its router rows; frozen after.
  router    after each task, from the frozen backbone's pooled feature, a fresh linear
            router is fitted on the router rows of the tasks so far: `memory` rows per
            task held out from its expert's training (a guess: the abstract says nothing
            on how the router sees earlier tasks; held out, so utilities are not inflated
            by an expert's memorising its rows).

Routing arms (ROUTINGS), scored on the same experts:

  bayes               U = sum_e q u + lambda H(q) ascended (u: the expert's answer right
                      or wrong), BMA p(a|x) = sum_e q(e|x) p_e(a|x)
  utility_no_entropy  the same with lambda = 0 (U's maximiser is one-hot)
  hard_task           the router trained by cross-entropy to the task id, its argmax
                      expert alone (hard task-id routing)
  oracle_task         the true task's expert alone (the upper bound of hard routing)

Metrics per arm (after each task, on the test rows of the tasks seen so far):
accuracy [T, T], final_accuracy, forgetting (prompt_experts.forgetting), ece (of the
final p(a|x) on every test row, equal-width bins), native_mass (mean q on the row's own
task's expert), routing_entropy (mean H(q)); and non_native_better, the share of final
test rows where some other task's expert gives the true answer a higher probability than
the row's own expert (the abstract's 49.9% statistic, in our reading of "outperforms").
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import ml_collections
import numpy as np
import optax
from flax import nnx

from moejax.config import base_config
from moejax.continual import bayesian_moe as bm
from moejax.continual import prompt_experts as pe
from moejax.train import classifier
from moejax.data import sort_of_clevr as sc
from moejax.errors import ConfigError
from moejax.models.vit import VisionTransformer

ROUTINGS = ("bayes", "utility_no_entropy", "hard_task", "oracle_task")
TASKS = ("shape", "left", "top", "nearest", "count")
PRETRAIN_TYPE = "exists"
ADAPTER = nnx.All(
  nnx.Param,
  nnx.Any(nnx.PathContains("lora_a"), nnx.PathContains("lora_b"), nnx.PathContains("head")),
)
BACKBONE = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("adapter")))  # and the head


@dataclasses.dataclass(frozen=True)
class VQASetup:
  """The stream's sizes (rows per task), the ViT, the schedules and the method's lambda."""

  train_rows: int = 500
  memory: int = 100
  test_rows: int = 200
  pretrain_rows: int = 2000
  d_model: int = 32
  layers: int = 2
  heads: int = 2
  head_dim: int = 16
  d_ff: int = 64
  patch: int = 3
  rank: int = 4
  pretrain_steps: int = 1000
  pretrain_lr: float = 3e-3
  steps_per_task: int = 300
  batch: int = 32
  lr: float = 3e-3
  router_steps: int = 300
  router_lr: float = 0.05
  lam: float = 0.25
  n_bins: int = 15

  def check(self, prefix: str = "bayesian_vqa") -> None:
    """One-line ConfigError naming `prefix`.<key> for a value the run cannot use."""
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{prefix}.{f.name}={value!r} must be an int >= 1")
      if f.name in ("pretrain_lr", "lr", "router_lr"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
          raise ConfigError(f"{prefix}.{f.name}={value!r} must be a number > 0")
    bm.check_lam(self.lam, f"{prefix}.lam")
    if self.memory >= self.train_rows:
      raise ConfigError(
        f"{prefix}.memory={self.memory} must be below {prefix}.train_rows={self.train_rows}"
        " (the router's rows are held out of the expert's)"
      )
    if sc.SIZE % self.patch:
      raise ConfigError(f"{prefix}.patch={self.patch} must divide the image size {sc.SIZE}")


@functools.cache
def adam(lr: float):
  """optax.adam(lr), one object per lr: the jitted steps take the optimizer as a static
  argument, so a second draw or expert reuses their compilation."""
  return optax.adam(lr)


def fused(images_NxHxWx3, questions_NxQ) -> np.ndarray:
  """[N, H, W, 3 + QUESTION_DIM]: the question broadcast to every pixel as channels."""
  n, h, w, _ = images_NxHxWx3.shape
  q = np.broadcast_to(questions_NxQ[:, None, None, :], (n, h, w, questions_NxQ.shape[-1]))
  return np.concatenate([images_NxHxWx3, q], axis=-1).astype(np.float32)


def model_config(s: VQASetup, num_classes: int = len(sc.ANSWERS)):
  """The ViT's model section: the fused input, one LoRA (rank s.rank) on q, k, v, o."""
  m = base_config().model
  m.scan_layers = False
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads = s.d_model, s.layers, s.heads, s.heads
  m.head_dim, m.d_ff, m.ffn_type = s.head_dim, s.d_ff, "dense"
  m.vit.update(
    dict(
      image_size=sc.SIZE,
      patch_size=s.patch,
      num_channels=3 + sc.QUESTION_DIM,
      num_classes=num_classes,
    )
  )
  m.vit.pooling = "mean"  # each patch sees the question: non-relational answers are local
  m.attention.adapter = "lora_mixer"
  lora = m.attention.lora_mixer
  lora.num_experts, lora.top_k, lora.rank = 1, 1, s.rank
  lora.loss_weights = ml_collections.ConfigDict({})
  return ml_collections.FrozenConfigDict(m)


def stream(s: VQASetup, seed: int, tasks=TASKS) -> dict:
  """The draw's data: {"pretrain": (x, y), "train": [(x, y)] per task, "test": [(x, y)]
  per task}, x fused; every split generated from `seed`."""

  def split(name, types, rows):
    images, questions, answers = sc.sort_of_clevr(name, types, rows, seed)
    x = fused(images, questions)
    return [
      (x[i * rows : (i + 1) * rows], answers[i * rows : (i + 1) * rows]) for i in range(len(types))
    ]

  return {
    "pretrain": split("pretrain", (PRETRAIN_TYPE,), s.pretrain_rows)[0],
    "train": split("train", tasks, s.train_rows),
    "test": split("test", tasks, s.test_rows),
  }


def pretrain_backbone(s: VQASetup, pretrain, seed: int) -> VisionTransformer:
  """The ViT trained on the pretraining questions (all but the LoRA; batches of 64, as
  prompt_experts.pretrain_backbone), module doc."""
  model = VisionTransformer(model_config(s), rngs=nnx.Rngs(seed))
  rng = np.random.default_rng([seed, 1])
  every_answer = np.ones(len(sc.ANSWERS), bool)
  x, y = pretrain
  steps = classifier.batches(rng, x, y, s.pretrain_steps, 64, every_answer)
  return classifier.trained_steps(model, BACKBONE, adam(s.pretrain_lr), steps)


def answer_probs(model, x) -> np.ndarray:
  return np.asarray(jax.nn.softmax(pe.logits_of(model, x), axis=-1))


def non_native_better(probs_ExNxA, labels_N, native_N) -> float:
  """Share of rows where another expert gives the label a higher probability than the
  row's own (native) expert."""
  p = np.asarray(probs_ExNxA)[:, np.arange(len(labels_N)), labels_N]  # [E, N]
  own = p[native_N, np.arange(len(labels_N))]
  others = np.where(np.arange(len(p))[:, None] == native_N[None], -np.inf, p)
  return float(np.mean(others.max(0) > own))


def run_stream(s: VQASetup, data: dict, backbone, seed: int, routings=ROUTINGS) -> dict:
  """Train the experts task after task and score every routing in `routings` on them
  (module doc): {routing: {metric: value}} plus "non_native_better"."""
  s.check()
  unknown = sorted(set(routings) - set(ROUTINGS))
  if unknown:
    raise ConfigError(f"bayesian_vqa routings {unknown} must be among {list(ROUTINGS)}")
  count, d = len(data["train"]), s.d_model
  features = pe.probed_features(backbone, VisionTransformer(model_config(s, d), rngs=nnx.Rngs(0)))
  rng = np.random.default_rng([seed, 2])
  held = [rng.permutation(len(y)) for _, y in data["train"]]
  pool_x = np.concatenate([x[h[: s.memory]] for (x, _), h in zip(data["train"], held)])
  pool_y = np.concatenate([y[h[: s.memory]] for (_, y), h in zip(data["train"], held)])
  pool_task = np.repeat(np.arange(count), s.memory)
  test_x = np.concatenate([x for x, _ in data["test"]])
  test_y = np.concatenate([y for _, y in data["test"]])
  test_task = np.repeat(np.arange(count), [len(y) for _, y in data["test"]])
  pool_f, test_f = features(pool_x), features(test_x)
  optimizer, router_optimizer = adam(s.lr), adam(s.router_lr)
  every_answer = np.ones(len(sc.ANSWERS), bool)
  pool_probs, test_probs = [], []
  accuracy = {r: np.full((count, count), np.nan) for r in routings}
  q_final: dict[str, np.ndarray] = {}
  p_final: dict[str, np.ndarray] = {}
  for t in range(count):
    x, y = data["train"][t]
    own = held[t][s.memory :]
    steps = classifier.batches(rng, x[own], y[own], s.steps_per_task, s.batch, every_answer)
    expert = classifier.trained_steps(nnx.clone(backbone), ADAPTER, optimizer, steps)
    pool_probs.append(answer_probs(expert, pool_x))
    test_probs.append(answer_probs(expert, test_x))
    rows, seen = pool_task <= t, test_task <= t
    available = np.arange(count) <= t
    utilities = np.zeros((len(pool_y), count), np.float32)  # 0 for experts not trained yet
    utilities[:, : t + 1] = bm.accuracy_utilities(np.stack(pool_probs), pool_y)
    for r in routings:
      if r == "oracle_task":
        q = np.eye(count, dtype=np.float32)[test_task[seen]]
      else:
        fit = dict(tasks=pool_task) if r == "hard_task" else dict(utilities=utilities)
        lam = s.lam if r == "bayes" else 0.0
        router = bm.fit_router(
          bm.Router(d, count), pool_f, available, router_optimizer, s.router_steps,
          lam=lam, rows_N=rows, **fit,
        )  # fmt: skip
        q = bm.routing_of(router, test_f[seen], available)
        if r == "hard_task":
          q = bm.hard_routing(q)
      p = bm.bma(q[:, : t + 1], np.stack(test_probs)[:, seen])
      right = p.argmax(-1) == test_y[seen]
      for j in range(t + 1):
        accuracy[r][t, j] = np.mean(right[test_task[seen] == j])
      q_final[r], p_final[r] = q, p
  out: dict = {"non_native_better": non_native_better(np.stack(test_probs), test_y, test_task)}
  for r in routings:
    a, q = accuracy[r], q_final[r]
    out[r] = dict(
      accuracy=a.tolist(),
      final_accuracy=float(np.mean(a[-1])),
      forgetting=pe.forgetting(a),
      ece=bm.ece(p_final[r], test_y, s.n_bins),
      native_mass=float(np.mean(q[np.arange(len(q)), test_task])),
      routing_entropy=float(np.mean(bm.entropy(q))),
    )
  return out


def prepared_draw(s: VQASetup, seed: int, tasks=TASKS) -> tuple[VisionTransformer, dict]:
  """(frozen backbone, stream data) of one seed."""
  s.check()
  data = stream(s, seed, tasks)
  return pretrain_backbone(s, data["pretrain"], seed), data
