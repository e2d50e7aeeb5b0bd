"""Distillation objectives, added to the student's next-token cross-entropy.

A method is registered in DISTILL_METHODS under the name config key
`distill.method` selects; its `loss(student_logits, teacher, targets, settings)`
returns (unweighted float32 scalar, {metric: scalar}) and the train step adds
`distill.weight` times it to the cross-entropy (moejax/train/distill.py). `teacher`
holds the arrays of the method's `teacher_keys`:

  logits       [B, L, V] the teacher's logits, in the student's vocabulary
  code         [B, L, d_s] Proj(h_t), the teacher's stage-1 code
               (moejax/distill/modules.py), in the student's width
  code_logits  [B, L, V] the student's output projection of the code: head_s(Proj(h_t))

and, for a method with `student_hidden`, "student_hidden" [B, L, d_s]: the student's
final hidden state (the final norm's output, the head's input), which the train step
then computes. No gradient reaches the teacher: its logits are wrapped in
stop_gradient here, its code where it enters the step (only the student's head is
differentiated through code_logits).

kl        Hinton et al. (2015), "Distilling the knowledge in a neural network":
          T^2 * mean over tokens of KL(softmax(z_t / T) || softmax(z_s / T)).
residual  Knowledge distillation through residual learning (ICLR submission,
          OpenReview Dh6KxUxG20; code "TBD"), stage 2: the student predicts the
          target from the residual h_s - Proj(h_t) of its final hidden state and
          the teacher's projected state, only at positions where the teacher's
          prediction (argmax of its logits) is wrong. The head is linear, so
          head_s(h_s - Proj(h_t)) = z_s - head_s(Proj(h_t)) exactly, and the term is
            sum_t m_t CE(z_s,t - head_s(Proj(h_t)), y_t) / (number of tokens),
            m_t = [argmax z_t,t != y_t].
          GUESSES (the paper's details are not public): the normalisation by all
          tokens (a teacher that is always right contributes 0, not 0/0), no term
          at teacher-right positions, and the argmax as the teacher's prediction.
hidden    hidden-state KD, the hint loss of FitNets (Romero et al. 2015, eq. 3) on the
          final hidden state: mean over tokens and features of (h_s - Proj(h_t))^2,
          the student matching the same projected teacher state that residual KD
          subtracts. GUESS: FitNets trains a regressor on the student's side; here
          the map between the widths is residual KD's stage-1 projector, fixed.
          It reads no teacher logits.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from moejax.registry import Registry


@dataclasses.dataclass(frozen=True)
class DistillMethod:
  """A registered objective: loss(student_logits, teacher, targets, settings) ->
  (float32 scalar, metrics); teacher_keys: the teacher arrays it reads; student_hidden:
  whether it also reads the student's final hidden state (module doc)."""

  name: str
  loss: Callable[..., tuple[jax.Array, dict]]
  teacher_keys: tuple[str, ...]
  student_hidden: bool = False


DISTILL_METHODS: Registry[DistillMethod] = Registry("distill.method")


def teacher_wrong_mask(teacher_logits_BxLxV, targets_BxL) -> jax.Array:
  """bool [B, L]: True where the teacher's argmax is not the target."""
  return jnp.argmax(teacher_logits_BxLxV, axis=-1) != targets_BxL


def kl_divergence(teacher_logits, student_logits, temperature: float) -> jax.Array:
  """Mean over tokens of KL(softmax(t / T) || softmax(s / T)), float32 nats, times T^2."""
  t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
  s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  per_token = jnp.sum(jnp.exp(t) * (t - s), axis=-1)
  return temperature**2 * jnp.mean(per_token)


def kl_loss(student_logits, teacher, targets, settings):
  """The 'kl' baseline (module doc)."""
  del targets
  logits = jax.lax.stop_gradient(teacher["logits"])
  return kl_divergence(logits, student_logits, settings["temperature"]), {}


def residual_loss(student_logits, teacher, targets, settings):
  """Residual KD, stage 2 (module doc): masked CE of the residual logits."""
  del settings
  teacher_logits = jax.lax.stop_gradient(teacher["logits"])
  # code_logits carries the student head's gradient (head_s is trained); the
  # teacher's code inside it was stopped where it entered (train/distill.py).
  residual_logits = student_logits.astype(jnp.float32) - teacher["code_logits"].astype(jnp.float32)
  wrong = teacher_wrong_mask(teacher_logits, targets).astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(residual_logits, targets)
  return jnp.sum(wrong * ce) / wrong.size, {"teacher_wrong_fraction": jnp.mean(wrong)}


def hidden_loss(student_logits, teacher, targets, settings):
  """Hidden-state KD (module doc): mean squared difference of the student's final hidden
  state and the teacher's code."""
  del student_logits, targets, settings
  hidden = teacher["student_hidden"].astype(jnp.float32)
  code = jax.lax.stop_gradient(teacher["code"]).astype(jnp.float32)
  return jnp.mean(jnp.square(hidden - code)), {}


DISTILL_METHODS.add("kl", DistillMethod("kl", kl_loss, ("logits",)))
DISTILL_METHODS.add("hidden", DistillMethod("hidden", hidden_loss, ("code",), student_hidden=True))
DISTILL_METHODS.add("residual", DistillMethod("residual", residual_loss, ("logits", "code_logits")))
