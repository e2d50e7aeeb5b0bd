"""teacher-MoE regression: a planted task with a known gated teacher.

The teacher is moejax's own MoE layer (top-1, SwiGLU experts, combine weight
the raw softmax probability) with random weights and a sharpened router
(kernel scaled by `gate_scale`), so its expert regions are well separated.
Inputs x ~ N(0, I_d); targets y = teacher(x) + noise, the noise Gaussian with
std `noise` times the std of the clean outputs. A student of the same family
(a different init) is trained on (x, y) with MSE + the layer's router losses
(Adam, cosine decay to 1% of the learning rate).

Known optimum: the Bayes predictor is the teacher itself, so the test MSE
floor is the noise variance; `noise_floor` gives it exactly on the test set
(mean squared noise that was drawn). Reported: test MSE / floor, and expert
recovery as `matched_purity`: the fraction of test inputs whose student
top-1 expert is matched to their teacher expert, under the one-to-one
matching of experts that maximises it (brute force over matchings).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from moejax.config import base_config
from moejax.layers.moe import MoELayer


@dataclasses.dataclass(frozen=True)
class Settings:
  d_model: int = 8
  num_experts: int = 4
  expert_d_ff: int = 16
  gate_scale: float = 10.0
  noise: float = 0.1  # noise std / std of the clean teacher outputs
  train_size: int = 8192
  test_size: int = 4096
  batch_size: int = 256
  steps: int = 2000
  learning_rate: float = 3e-3
  balance_weight: float = 1e-2


def layer_config(s: Settings, num_experts: int | None = None):
  """The MoE layer config of teacher and student: top-1, raw softmax weight, dropless."""
  c = base_config().model.moe
  c.num_experts = num_experts or s.num_experts
  c.top_k, c.expert_d_ff, c.routing.renormalize = 1, s.expert_d_ff, False
  c.loss_weights = {"load_balance": s.balance_weight}
  return ml_collections.FrozenConfigDict(c)  # as layers hold it: a hashable graphdef


def make_teacher(s: Settings, seed: int) -> MoELayer:
  teacher = MoELayer(s.d_model, layer_config(s), rngs=nnx.Rngs(seed), dtype=jnp.float32)
  kernel = teacher.router_kernel
  assert kernel is not None  # the top-k router projects with the layer's kernel
  kernel.set_value(s.gate_scale * jax.random.normal(jax.random.key(seed), kernel[...].shape))
  return teacher


def top1(layer: MoELayer, x) -> tuple[jax.Array, np.ndarray]:
  """(outputs [N, d], top-1 expert [N]) of an MoE layer on inputs [N, d]."""
  y, expert = _top1(*nnx.split(layer), x)
  return y, np.asarray(expert)


@functools.partial(jax.jit, static_argnums=0)
def _top1(graphdef, state, x):
  y, aux = nnx.merge(graphdef, state)(x[None])
  return y[0], aux["expert_index"][:, 0]


def sample(teacher: MoELayer, s: Settings, n: int, seed: int) -> dict:
  """x, y = clean + noise, the clean teacher output and the teacher's expert per input."""
  kx, kn = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(kx, (n, s.d_model))
  clean, expert = top1(teacher, x)
  return {
    "x": x,
    "clean": clean,
    "expert": expert,
    "noise": s.noise * jax.random.normal(kn, clean.shape),
  }


def noise_floor(data: dict) -> float:
  """The Bayes predictor's (the teacher's) MSE on these samples: mean squared noise."""
  return float(jnp.mean(data["noise"] ** 2))


def matched_purity(teacher_expert, student_expert) -> float:
  """max over one-to-one expert matchings of the fraction of inputs whose student
  expert is matched to their teacher expert (unmatched experts score nothing)."""
  t, s = (
    np.unique(teacher_expert, return_inverse=True),
    np.unique(student_expert, return_inverse=True),
  )
  counts = np.zeros((len(t[0]), len(s[0])))
  np.add.at(counts, (t[1], s[1]), 1)
  if counts.shape[0] > counts.shape[1]:
    counts = counts.T
  rows = range(counts.shape[0])
  best = max(
    counts[rows, list(cols)].sum()
    for cols in itertools.permutations(range(counts.shape[1]), counts.shape[0])
  )
  return float(best / counts.sum())


def train_student(
  s: Settings,
  *,
  teacher_seed: int = 0,
  student_seed: int = 1,
  num_experts: int | None = None,
  log=None,
) -> dict:
  """Train a student on the teacher's data; test MSE, floor, ratio, matched purity."""
  teacher = make_teacher(s, teacher_seed)
  probe = sample(teacher, s, 4096, seed=10_000 + teacher_seed)
  s = dataclasses.replace(s, noise=s.noise * float(jnp.std(probe["clean"])))
  train = sample(teacher, s, s.train_size, seed=20_000 + teacher_seed)
  test = sample(teacher, s, s.test_size, seed=30_000 + teacher_seed)
  student = MoELayer(
    s.d_model, layer_config(s, num_experts), rngs=nnx.Rngs(student_seed), dtype=jnp.float32
  )
  split = nnx.split(student, nnx.Param, ...)
  graphdef, params, rest = split  # type: ignore[misc]  # nnx.split stub: any arity
  optimizer = optax.adam(optax.cosine_decay_schedule(s.learning_rate, s.steps, alpha=0.01))
  opt_state = optimizer.init(params)
  targets = train["clean"] + train["noise"]

  @jax.jit
  def step(params, opt_state, x, y):
    def loss_fn(p):
      out, aux = nnx.merge(graphdef, p, rest)(x[None], train=True)
      return jnp.mean((out[0] - y) ** 2) + aux["aux_loss"]

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  order = np.random.default_rng(student_seed)
  for i in range(s.steps):
    rows = order.integers(0, s.train_size, s.batch_size)
    params, opt_state, loss = step(params, opt_state, train["x"][rows], targets[rows])
    if log is not None and (i + 1) % 500 == 0:
      log(f"step {i + 1}: train loss {float(loss):.5f}")
  prediction, expert = top1(nnx.merge(graphdef, params, rest), test["x"])
  mse = float(jnp.mean((prediction - test["clean"] - test["noise"]) ** 2))
  floor = noise_floor(test)
  return {
    "test_mse": mse,
    "noise_floor": floor,
    "mse_over_floor": mse / floor,
    "matched_purity": matched_purity(test["expert"], expert),
    "teacher_expert_fractions": (
      np.bincount(test["expert"], minlength=s.num_experts) / s.test_size
    ).tolist(),
  }
