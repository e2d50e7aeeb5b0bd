"""Stage 1 of residual KD (OpenReview Dh6KxUxG20; code "TBD"): what the teacher's
hidden state becomes before the student subtracts it.

ExpertAttention  an MoE teacher's per-token expert outputs fused by self-attention
                 over the experts: A = softmax(Y W_q (Y W_k)^T / sqrt(a)) over a
                 token's K routed expert outputs Y [K, d], fused = mean_i (A Y)_i.
                 W_q starts at 0, so training starts from uniform attention, which
                 is the mean of the expert outputs (tests/distill/test_modules.py).
Projector        the low-dimensional projector and its decoder, trained as an
                 autoencoder on the teacher's features (ExpertAttention's output for
                 an MoE teacher, the final hidden state otherwise):
                 Proj(f) = rms(f W_enc), f_hat = Proj(f) W_dec, loss
                 ||f_hat - f||^2 / ||f||^2 (the target stop-gradient).
CrossModelAttention  the student's positions attend over the teacher's
                 (student queries, teacher keys and values) under an allowed mask:
                 the alignment of two tokenizations of one text.

GUESSES (the paper's details are not public): the code width is the student's
d_model (so h_s - Proj(h_t) needs no trained stage-2 map), the code is RMS-normalised
(the scale of the student's final-norm output), values are the expert outputs
themselves (no value projection), the pooled output is the mean over the experts'
attended outputs, the reconstruction loss is relative, and the expert attention is
trained with the autoencoder. The trainer (moejax/train/distill.py) aligns teacher
and student position by position (one tokenizer); CrossModelAttention is the part
for two tokenizers and is not yet wired into it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

NEG_INF = -1e30  # a masked score: finite, so a fully masked row has no NaN gradient


def rms_normalize(x, eps: float = 1e-6):
  """x / sqrt(mean(x^2) + eps) over the last axis (an RMSNorm without weight)."""
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


class ExpertAttention(nnx.Module):
  """Self-attention over a token's expert outputs, pooled to one vector (module doc)."""

  def __init__(self, d_model: int, d_attn: int, *, rngs: nnx.Rngs):
    self.d_attn = d_attn
    self.query = nnx.Param(jnp.zeros((d_model, d_attn), jnp.float32))
    self.key = nnx.Param(
      jax.random.normal(rngs.params(), (d_model, d_attn), jnp.float32) * d_model**-0.5
    )

  def __call__(self, outputs_NxKxD, valid_NxK):
    """Fused [N, d] of the expert outputs [N, K, d] whose slot is valid [N, K]."""
    y = outputs_NxKxD.astype(jnp.float32)
    q, k = y @ self.query[...], y @ self.key[...]
    scores = jnp.einsum("nia,nja->nij", q, k) / jnp.sqrt(float(self.d_attn))
    scores = jnp.where(valid_NxK[:, None, :], scores, NEG_INF)
    attended = jnp.einsum("nij,njd->nid", jax.nn.softmax(scores, axis=-1), y)
    weight = valid_NxK.astype(jnp.float32)
    weight = weight / jnp.maximum(jnp.sum(weight, axis=-1, keepdims=True), 1.0)
    return jnp.einsum("ni,nid->nd", weight, attended)


class Projector(nnx.Module):
  """Teacher features -> the code Proj(f) [.., d_code], and back (module doc).

  fuse_experts: the teacher's expert outputs are fused by an ExpertAttention
  (an MoE teacher); else its final hidden state is the feature."""

  def __init__(self, d_teacher: int, d_code: int, *, fuse_experts: bool, rngs: nnx.Rngs):
    self.fuse = ExpertAttention(d_teacher, 32, rngs=rngs) if fuse_experts else nnx.data(None)
    self.encoder = nnx.Param(
      jax.random.normal(rngs.params(), (d_teacher, d_code), jnp.float32) * d_teacher**-0.5
    )
    # Zero: the fit starts at relative error 1 whatever the features' scale.
    self.decoder = nnx.Param(jnp.zeros((d_code, d_teacher), jnp.float32))

  def features(self, teacher: dict):
    """[N, d_teacher]: the fused expert outputs, or the final hidden state."""
    if self.fuse is None:
      return teacher["hidden"].astype(jnp.float32)
    return self.fuse(teacher["experts"], teacher["valid"])

  def encode(self, features_NxD):
    return rms_normalize(features_NxD @ self.encoder[...])

  def reconstruction_loss(self, teacher: dict):
    """||decode(encode(f)) - f||^2 / ||f||^2 over the batch, f the features."""
    f = self.features(teacher)
    target = jax.lax.stop_gradient(f)
    error = self.encode(f) @ self.decoder[...] - target
    return jnp.sum(jnp.square(error)) / jnp.maximum(jnp.sum(jnp.square(target)), 1e-12)


def fit_projector(projector: Projector, teacher_batches, learning_rate: float) -> list[float]:
  """Stage 1: one Adam step per teacher batch (dicts of Projector.features' inputs)
  on the reconstruction loss; the projector is updated in place. Returns the loss
  before each step."""
  split = nnx.split(projector, nnx.Param, ...)
  graphdef, params, rest = split  # type: ignore[misc]  # nnx.split stub: any arity
  optimizer = optax.adam(learning_rate)

  @jax.jit
  def step(params, opt_state, teacher):
    def loss(p):
      return nnx.merge(graphdef, p, rest).reconstruction_loss(teacher)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  opt_state, losses = optimizer.init(params), []
  for teacher in teacher_batches:
    params, opt_state, value = step(params, opt_state, teacher)
    losses.append(float(value))
  nnx.update(projector, params)
  return losses


class CrossModelAttention(nnx.Module):
  """Student positions attend over teacher positions: queries from the student's
  hidden states, keys and values from the teacher's (module doc)."""

  def __init__(self, d_student: int, d_teacher: int, d_attn: int, *, rngs: nnx.Rngs):
    def init(shape, fan_in):
      return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32) * fan_in**-0.5)

    self.d_attn = d_attn
    self.query = init((d_student, d_attn), d_student)
    self.key = init((d_teacher, d_attn), d_teacher)
    self.value = init((d_teacher, d_student), d_teacher)

  def __call__(self, student_BxSxD, teacher_BxTxE, allowed_BxSxT):
    """[B, S, d_student]: per student position, the attended teacher values. A
    student position with no allowed teacher position gets 0."""
    q = student_BxSxD.astype(jnp.float32) @ self.query[...]
    k = teacher_BxTxE.astype(jnp.float32) @ self.key[...]
    scores = jnp.einsum("bsa,bta->bst", q, k) / jnp.sqrt(float(self.d_attn))
    scores = jnp.where(allowed_BxSxT, scores, NEG_INF)
    weights = jax.nn.softmax(scores, axis=-1) * allowed_BxSxT  # a row with none allowed: 0
    return jnp.einsum("bst,bte->bse", weights, teacher_BxTxE.astype(jnp.float32) @ self.value[...])
