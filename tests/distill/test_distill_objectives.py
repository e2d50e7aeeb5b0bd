"""The distillation objectives (moejax/distill/objectives.py) against hand-worked
values, an enumeration of the teacher-wrong mask, and closed forms."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.distill.objectives import (
  DISTILL_METHODS,
  hidden_loss,
  kl_divergence,
  residual_loss,
  teacher_wrong_mask,
)
from moejax.errors import ConfigError


def log_softmax(x):
  x = np.asarray(x, np.float64)
  return (
    x
    - np.max(x, -1, keepdims=True)
    - np.log(np.sum(np.exp(x - np.max(x, -1, keepdims=True)), -1, keepdims=True))
  )


def test_the_mask_is_on_exactly_where_the_teacher_argmax_misses_the_target():
  # Every (teacher argmax, target) pair of a 3-token vocabulary, one per position.
  pairs = list(itertools.product(range(3), range(3)))
  teacher = np.stack([np.eye(3)[a] * 5.0 + 0.1 * k for k, (a, _) in enumerate(pairs)])
  targets = np.array([y for _, y in pairs])
  mask = np.asarray(teacher_wrong_mask(jnp.asarray(teacher[None]), jnp.asarray(targets[None])))
  assert mask[0].tolist() == [a != y for a, y in pairs]


def test_kl_and_residual_terms_equal_hand_worked_values():
  # kl: V=2, T=2: teacher logits [2 ln 3, 0] / 2 -> p_t = [3/4, 1/4]; student uniform.
  teacher = jnp.array([[[2 * math.log(3.0), 0.0]]])
  student = jnp.zeros((1, 1, 2))
  expected = 4 * (0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5))
  assert float(kl_divergence(teacher, student, 2.0)) == pytest.approx(expected, rel=1e-6)
  # residual: position 0 teacher wrong (argmax 1, target 0), residual logits [0, 1]:
  # CE = ln(1 + e); position 1 teacher right: 0. Mean over the 2 tokens.
  loss, metrics = residual_loss(
    jnp.array([[[1.0, 0.0], [0.3, -2.0]]]),
    {
      "logits": jnp.array([[[0.0, 1.0], [1.0, 0.0]]]),
      "code_logits": jnp.array([[[1.0, -1.0], [5.0, 5.0]]]),
    },
    jnp.array([[0, 0]]),
    {},
  )
  assert float(loss) == pytest.approx(math.log(1 + math.e) / 2, rel=1e-6)
  assert float(metrics["teacher_wrong_fraction"]) == 0.5


def test_a_teacher_equal_to_the_targets_gives_a_zero_residual_and_kl_equal_to_ce():
  rng = np.random.default_rng(0)
  student = jnp.asarray(rng.normal(size=(2, 5, 7)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 7, (2, 5)))
  one_hot = jax.nn.one_hot(targets, 7) * 1e4  # the teacher predicts every target
  code = jnp.asarray(rng.normal(size=(2, 5, 7)), jnp.float32)
  loss, _ = residual_loss(student, {"logits": one_hot, "code_logits": code}, targets, {})
  assert float(loss) == 0.0
  ce = -np.mean(np.take_along_axis(log_softmax(student), np.asarray(targets)[..., None], -1))
  assert float(kl_divergence(one_hot, student, 1.0)) == pytest.approx(ce, rel=1e-5)


def test_the_residual_term_is_the_masked_cross_entropy_of_student_minus_code_logits():
  rng = np.random.default_rng(1)
  student, teacher, code = (rng.normal(size=(3, 4, 6)) for _ in range(3))
  targets = rng.integers(0, 6, (3, 4))
  loss, _ = residual_loss(
    jnp.asarray(student),
    {"logits": jnp.asarray(teacher), "code_logits": jnp.asarray(code)},
    jnp.asarray(targets),
    {},
  )
  total = 0.0
  for b, t in itertools.product(range(3), range(4)):
    if np.argmax(teacher[b, t]) != targets[b, t]:
      total -= log_softmax(student[b, t] - code[b, t])[targets[b, t]]
  assert float(loss) == pytest.approx(total / 12, rel=1e-5)


def test_gradients_of_the_terms_do_not_reach_the_teacher():
  """Each method moves the student (its logits, or its hidden state where it reads
  that) and neither the teacher's logits nor its code."""
  rng = np.random.default_rng(2)
  student, teacher, code, hidden = (jnp.asarray(rng.normal(size=(2, 3, 5))) for _ in range(4))
  targets = jnp.asarray(rng.integers(0, 5, (2, 3)))
  for name, method in DISTILL_METHODS.items():

    def loss(teacher_logits, teacher_code, student_logits, student_hidden):
      arrays = {"logits": teacher_logits, "code_logits": teacher_code, "code": teacher_code}
      if method.student_hidden:
        arrays["student_hidden"] = student_hidden
      return method.loss(student_logits, arrays, targets, {"temperature": 2.0})[0]

    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(teacher, code, student, hidden)
    to_teacher, to_code, to_student = grads[0], grads[1], grads[3 if method.student_hidden else 2]
    assert not np.any(np.asarray(to_teacher)), name
    assert np.any(np.asarray(to_student)), name
    if "code" in method.teacher_keys:
      assert not np.any(np.asarray(to_code)), name


def test_the_hidden_term_is_the_mean_squared_difference_by_hand():
  rng = np.random.default_rng(3)
  hidden, code = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
  arrays = {"student_hidden": jnp.asarray(hidden), "code": jnp.asarray(code)}
  loss, _ = hidden_loss(None, arrays, None, {})
  total = sum(
    (hidden[b, t, k] - code[b, t, k]) ** 2 for b in range(2) for t in range(3) for k in range(4)
  )
  assert float(loss) == pytest.approx(total / 24, rel=1e-6)
  assert DISTILL_METHODS.get("hidden").teacher_keys == ("code",)  # no teacher logits


def test_an_unknown_method_names_the_key_and_the_valid_ones():
  with pytest.raises(ConfigError, match=r"distill\.method='rkd'.*hidden, kl, residual"):
    DISTILL_METHODS.get("rkd")
