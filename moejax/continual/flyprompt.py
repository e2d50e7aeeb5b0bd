"""FlyPrompt (ICLR 2026, arXiv 2602.01976) on the class-incremental digits stream of
moejax/continual/prompt_experts.py, with blurry task boundaries.

Per task t one prompt expert: per_task key/value prefix pairs in the attention of the
first blocks (the `smope` adapter with fixed experts, as task_prompts there), trained
with the task id known (the paper trains expert t on task t); expert t > 0 starts as
the position-wise mean of experts 0..t-1 (the official init_new_expert). One online
linear head is trained by gradient on every task; TE^2 keeps EMA heads per expert
(moejax/continual/rear.py EMAHeadBank, started from the online head when the expert
starts, updated after every step). After each task the frozen backbone's CLS
features of its rows are collected into the router with target t.

At test time a router picks each image's expert from its frozen CLS feature:

  rear    REAR, h = ReLU(f W_rand), M = `width` (moejax/continual/rear.py)
  ridge   the same ridge with M = 0 (h = f): no expansion, the same gamma (as the
          official code's M = 0)
  ridge_matched  M = 0 with gamma scaled to REAR's strength relative to the mean
          diagonal of G (rear.py matched_ridge; our baseline: the expansion scales G
          up, so the same gamma regularises M = 0 far more)
  key     key matching (L2P / DualPrompt; task_prompts of prompt_experts.py): the
          expert whose key, the normalised mean of its task's normalised features,
          has the largest cosine with the image's feature
  oracle  the true task of the image's class (the upper bound of routing)

and the prediction is the argmax of the max over the heads (online and the routed
expert's EMA heads) of their softmaxes over the classes seen so far. The training
(prompts, heads, router statistics) does not depend on the router, so one run scores
every router on the same experts and heads.

Blurry boundaries (our setting, not the paper's Si-Blurry stream): a fraction
`blurry` of each task's training rows moves to a neighbouring task
(moejax/data/class_stream.py blurry_task_rows); the task's logits are masked to the
classes present in its rows. Differences from the paper: prefix key/value pairs per
expert in our smope adapter (the official code appends prompt tokens to blocks 0-4),
training task by task with Adam (not one online pass), evaluation after each task.

Metrics per router: routing_accuracy (share of all test images routed to their class's
task after the last task), routing_matrix [T, T] (the share of task i's test images
routed to expert j, after the last task), accuracy [T, T] (on task j's test images after task t),
final_accuracy (mean over j of the last row), auc_accuracy (area under the accuracy
curve, Koh et al. 2022's A_auc: the mean over evaluation points, one after each
task, of the accuracy on the test images of the classes seen so far; the points are
equally spaced in tasks here, so the normalised area is their mean), forgetting, and
online_final_accuracy (the online head alone, on the same routing).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from moejax.continual import prompt_experts as pe
from moejax.train import classifier
from moejax.continual.rear import (
  EMAHeadBank,
  RandomExpandedRidgeRouter,
  matched_ridge,
  max_of_softmaxes,
)
from moejax.data.class_stream import blurry_task_rows, task_rows
from moejax.errors import ConfigError
from moejax.models.vit import VisionTransformer

ROUTERS = ("rear", "ridge", "ridge_matched", "key", "oracle")
METHOD = "task_prompts"  # the smope adapter with one fixed slice of experts per task


@dataclasses.dataclass(frozen=True)
class FlySetup:
  """FlyPrompt's own settings: REAR's `width` M and `ridge` gamma, TE^2's `decays`,
  the `blurry` fraction of each task's rows from its neighbours."""

  width: int = 1000
  ridge: float = 1e4
  decays: tuple[float, ...] = (0.9, 0.99)
  blurry: float = 0.1

  def check(self, prefix: str = "flyprompt") -> None:
    """One-line ConfigError naming `prefix`.<key> for a bad value."""
    RandomExpandedRidgeRouter(1, self.width, self.ridge, 1, prefix=prefix)
    EMAHeadBank(1, tuple(self.decays), prefix=prefix)
    b = self.blurry
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b < 1:
      raise ConfigError(f"{prefix}.blurry={b!r} must be a number in [0, 1)")


def expert_slice(expert: int, per_task: int) -> slice:
  return slice(expert * per_task, (expert + 1) * per_task)


def assign_expert(prompt, expert: int, per_task: int) -> None:
  """Every image uses expert `expert`'s prefix pairs."""
  chosen = expert_slice(expert, per_task)
  prompt.assign(np.arange(chosen.start, chosen.stop)[None])


def start_from_mean(prompt, expert: int, per_task: int) -> None:
  """Expert `expert`'s keys and values := the position-wise mean of experts 0..expert-1
  (the official init_new_expert; expert 0 keeps its initialisation)."""
  if expert == 0:
    return
  for table in (prompt.keys, prompt.values):
    x = table[...]
    b, h, _, d = x.shape
    earlier = x[:, :, : expert * per_task].reshape(b, h, expert, per_task, d).mean(axis=2)
    table[...] = x.at[:, :, expert_slice(expert, per_task)].set(earlier)


def online_head(model) -> tuple[np.ndarray, np.ndarray]:
  """(kernel [d, C], bias [C]) of the ViT's head, as numpy."""
  assert model.head.bias is not None  # the ViT's head has a bias
  return np.asarray(model.head.kernel[...]), np.asarray(model.head.bias[...])


def prompted_features(s: pe.Setup, model, experts: int, per_task: int, count: int, x):
  """[experts, B, d]: the pooled feature of `x` with each expert's prompts."""
  out = []
  for e in range(experts):
    assign_expert(model.prompt, e, per_task)
    out.append(pe.feature_fn(s, model, METHOD, count)(x))
  return np.stack(out)


def run_flyprompt(
  s: pe.Setup, fly: FlySetup, backbone, data, tasks, seed: int, routers=ROUTERS
) -> dict:
  """Train FlyPrompt task after task on the frozen backbone (module doc); {router:
  {metric: value}} for each of `routers`, plus "model" (the last one)."""
  fly.check()
  unknown = sorted(set(routers) - set(ROUTERS))
  if unknown:
    raise ConfigError(f"flyprompt routers {unknown} must be among {list(ROUTERS)}")
  train_x, train_y, test_x, test_y = data
  num_classes, count = int(max(train_y.max(), test_y.max())) + 1, len(tasks)
  model = VisionTransformer(pe.model_config(s, num_classes, METHOD, count), rngs=nnx.Rngs(seed))
  pe.copy_backbone(backbone, model)
  per_task = model.prompt.num_experts // count
  train_rows = blurry_task_rows(train_y, tasks, fly.blurry, seed)
  test_rows = task_rows(test_y, tasks)
  true_task = np.full(len(test_y), -1)
  for j, rows in enumerate(test_rows):
    true_task[rows] = j
  frozen = pe.feature_fn(s, backbone)
  test_frozen = frozen(test_x)
  ridge = {
    "rear": RandomExpandedRidgeRouter(s.d_model, fly.width, fly.ridge, count, seed),
    "ridge": RandomExpandedRidgeRouter(s.d_model, 0, fly.ridge, count, seed),
  }
  ridge_state = {name: router.init() for name, router in ridge.items()}
  keys: list[np.ndarray] = []
  te2 = EMAHeadBank(count, tuple(fly.decays))
  bank = te2.init(*online_head(model))
  rng = np.random.default_rng(seed)
  optimizer = optax.adam(s.lr)
  seen: set[int] = set()
  kinds = ("te2", "online")
  accuracy = {(r, k): np.full((count, count), np.nan) for r in routers for k in kinds}
  anytime: dict[tuple[str, str], list[float]] = {(r, k): [] for r in routers for k in kinds}
  guesses: dict[str, np.ndarray] = {}
  for t in range(count):
    x, y = train_x[train_rows[t]], train_y[train_rows[t]]
    present = np.unique(y)
    seen |= {int(c) for c in present}
    allowed = jnp.isin(jnp.arange(num_classes), jnp.asarray(present))
    start_from_mean(model.prompt, t, per_task)
    assign_expert(model.prompt, t, per_task)
    bank = te2.start(bank, t, *online_head(model))

    def ema_step(m, t=t):
      nonlocal bank
      bank = te2.update(bank, t, *online_head(m))

    steps = classifier.batches(rng, x, y, s.steps_per_task, s.batch, allowed)
    model = classifier.trained_steps(
      model, pe.PROMPT_AND_HEAD, optimizer, steps, after_step=ema_step
    )
    f = frozen(x)
    for name, router in ridge.items():
      ridge_state[name] = router.collect(ridge_state[name], f, np.full(len(y), t))
    keys.append(pe.normalised(pe.normalised(f).mean(0)))
    features = prompted_features(s, model, t + 1, per_task, count, test_x)
    for r in routers:
      if r in ("rear", "ridge", "ridge_matched"):
        name = "rear" if r == "rear" else "ridge"
        router, state = ridge[name], ridge_state[name]
        if r == "ridge_matched":
          gamma = matched_ridge(fly.ridge, router, state, ridge["rear"], ridge_state["rear"])
          router = dataclasses.replace(router, ridge=gamma)
        guess = router.route(state, router.solve(state), test_frozen, seen=t + 1)
      elif r == "key":
        guess = np.argmax(pe.normalised(test_frozen) @ np.stack(keys).T, axis=-1)
      else:
        guess = np.minimum(true_task, t)  # later tasks' images: the newest expert
      guesses[r] = guess
      feature = features[guess, np.arange(len(guess))]
      kernel, bias = online_head(model)
      online = feature @ kernel + bias
      heads = np.concatenate([online[None], te2.logits(bank, guess, feature)])
      heads = np.where(np.isin(np.arange(num_classes), sorted(seen)), heads, classifier.MASKED)
      predicted = {"te2": np.argmax(max_of_softmaxes(heads), -1), "online": heads[0].argmax(-1)}
      shown = np.isin(test_y, sorted(seen))
      for kind, p in predicted.items():
        for j in range(t + 1):
          accuracy[r, kind][t, j] = np.mean(p[test_rows[j]] == test_y[test_rows[j]])
        anytime[r, kind].append(float(np.mean(p[shown] == test_y[shown])))
  out: dict = {"model": model}
  for r in routers:
    a = accuracy[r, "te2"]
    out[r] = dict(
      routing_accuracy=float(np.mean(guesses[r] == true_task)),
      routing_matrix=routing_matrix(true_task, guesses[r], count).tolist(),
      accuracy=a.tolist(),
      final_accuracy=float(np.mean(a[-1])),
      auc_accuracy=float(np.mean(anytime[r, "te2"])),
      forgetting=pe.forgetting(a),
      online_final_accuracy=float(np.mean(accuracy[r, "online"][-1])),
    )
  return out


def routing_matrix(true_task, routed, count: int) -> np.ndarray:
  """[count, count]: row i the share of task i's images routed to each expert j (a row
  of zeros for a task with no images)."""
  out = np.zeros((count, count))
  np.add.at(out, (true_task, routed), 1.0)
  return out / np.maximum(out.sum(1, keepdims=True), 1.0)
