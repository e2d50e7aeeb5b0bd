"""Stage-1 modules of residual KD (moejax/distill/modules.py) against per-token
loops: expert attention (uniform = the mean of the expert outputs), cross-model
attention under its mask, and the projector's autoencoder fit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.distill.modules import CrossModelAttention, ExpertAttention, Projector, fit_projector


def softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def expert_attention_loop(y, valid, wq, wk):
  """One token at a time, only its valid experts: mean_i sum_j a_ij y_j."""
  out = []
  for y_t, v_t in zip(y, valid):
    kept = y_t[v_t]
    q, k = kept @ wq, kept @ wk
    attended = [softmax(q[i] @ k.T / np.sqrt(wq.shape[1])) @ kept for i in range(len(kept))]
    out.append(np.mean(attended, axis=0))
  return np.stack(out)


@pytest.fixture(scope="module")
def expert_outputs():
  rng = np.random.default_rng(0)
  y = rng.normal(size=(6, 4, 8)).astype(np.float32)
  valid = np.array(
    [[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]], bool
  )
  return y, valid


def test_uniform_expert_attention_is_the_mean_of_the_valid_expert_outputs(expert_outputs):
  y, valid = expert_outputs
  attention = ExpertAttention(8, 4, rngs=nnx.Rngs(0))  # W_q = 0 at initialisation
  fused = np.asarray(attention(jnp.asarray(y), jnp.asarray(valid)))
  means = np.stack([y_t[v_t].mean(0) for y_t, v_t in zip(y, valid)])
  np.testing.assert_allclose(fused, means, atol=1e-6)


def test_trained_expert_attention_matches_a_per_token_loop(expert_outputs):
  y, valid = expert_outputs
  attention = ExpertAttention(8, 4, rngs=nnx.Rngs(0))
  attention.query[...] = jax.random.normal(jax.random.key(1), (8, 4))
  fused = np.asarray(attention(jnp.asarray(y), jnp.asarray(valid)))
  expected = expert_attention_loop(
    y, valid, np.asarray(attention.query[...]), np.asarray(attention.key[...])
  )
  np.testing.assert_allclose(fused, expected, atol=1e-5)
  assert not np.allclose(fused, np.stack([y_t[v_t].mean(0) for y_t, v_t in zip(y, valid)]))


def test_cross_model_attention_reads_only_allowed_teacher_positions():
  rng = np.random.default_rng(1)
  student, teacher = rng.normal(size=(1, 3, 6)), rng.normal(size=(1, 5, 10))
  allowed = np.zeros((1, 3, 5), bool)
  allowed[0, 0, 2] = True  # student 0 sees teacher 2 only
  allowed[0, 1, :4] = True  # student 1 sees teacher 0..3; student 2 sees nothing
  attention = CrossModelAttention(6, 10, 4, rngs=nnx.Rngs(0))
  out = np.asarray(attention(jnp.asarray(student), jnp.asarray(teacher), jnp.asarray(allowed)))
  value = teacher[0] @ np.asarray(attention.value[...])
  np.testing.assert_allclose(out[0, 0], value[2], atol=1e-5)
  np.testing.assert_allclose(out[0, 2], 0.0)
  q, k = (
    student[0, 1] @ np.asarray(attention.query[...]),
    teacher[0, :4] @ np.asarray(attention.key[...]),
  )
  np.testing.assert_allclose(out[0, 1], softmax(k @ q / 2.0) @ value[:4], atol=1e-5)
  changed = teacher.copy()
  changed[0, 4] += 100.0  # no student position may see teacher position 4
  again = attention(jnp.asarray(student), jnp.asarray(changed), jnp.asarray(allowed))
  np.testing.assert_allclose(np.asarray(again), out, atol=1e-6)


def test_the_projector_autoencoder_fits_features_that_lie_in_its_code_dimension():
  # Features on the unit sphere of a 3-dim subspace of R^12: a 3-wide code (RMS
  # normalised) loses nothing, so the relative reconstruction error can fall to ~0.
  rng = np.random.default_rng(2)
  basis = np.linalg.qr(rng.normal(size=(12, 3)))[0]
  batches = []
  for _ in range(200):
    z = rng.normal(size=(64, 3))
    batches.append(
      {"hidden": jnp.asarray((z / np.linalg.norm(z, axis=1, keepdims=True)) @ basis.T, jnp.float32)}
    )
  projector = Projector(12, 3, fuse_experts=False, rngs=nnx.Rngs(0))
  losses = fit_projector(projector, batches, learning_rate=1e-2)
  assert losses[0] == pytest.approx(1.0) and np.mean(losses[-20:]) < 1e-4, losses[-20:]
