"""The classifier loop (moejax/train/classifier.py) on a linear softmax classifier, whose
gradient is known in closed form: one SGD step equals W - lr x^T (p - onehot) / B with p
the softmax over the allowed classes (plus the router loss's gradient when asked);
masked classes' weights and the parameters not selected never move; before_step sees
the current parameters and the step index; batches draw without replacement unless
short."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from moejax.train import classifier

D, C, B = 5, 4, 6


class Linear(nnx.Module):
  """logits = x W + b; aux_loss = 0.5 ||W||^2 (a stand-in for a router loss); `frozen`
  is a Param the tests leave out of training."""

  def __init__(self, rngs):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (D, C)))
    self.b = nnx.Param(jnp.zeros((C,)))
    self.frozen = nnx.Param(jnp.ones((3,)))

  def __call__(self, x, *, train=False, rng=None):
    aux = {"aux_loss": 0.5 * jnp.sum(self.w[...] ** 2)}
    return x @ self.w[...] + self.b[...] + 0 * jnp.sum(self.frozen[...]), aux, None


def data(seed=0):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(B, D)).astype(np.float32), rng.integers(0, 2, B)


TRAINED = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("frozen")))


def by_hand(w, b, x, y, allowed, lr, router_losses):
  logits = x @ w + b
  logits = np.where(allowed, logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  residual = (p - np.eye(C)[y]) / B
  grad_w = x.T @ residual + (w if router_losses else 0)
  return w - lr * grad_w, b - lr * residual.sum(0)


@pytest.mark.parametrize("router_losses", [False, True])
def test_one_sgd_step_is_the_closed_form_and_masked_classes_stay(router_losses):
  model = Linear(nnx.Rngs(0))
  w0, b0 = np.asarray(model.w[...]), np.asarray(model.b[...])
  x, y = data()
  allowed = np.array([True, True, False, True])
  out = classifier.trained_steps(
    model,
    TRAINED,
    optax.sgd(0.3),
    [(jnp.asarray(x), jnp.asarray(y), jnp.asarray(allowed))],
    router_losses=router_losses,
  )
  w, b = by_hand(w0, b0, x, y, allowed, 0.3, router_losses)
  np.testing.assert_allclose(out.w[...], w, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out.b[...], b, rtol=1e-6, atol=1e-6)
  if not router_losses:  # the masked class's column gets no gradient at all
    np.testing.assert_array_equal(out.w[...][:, 2], w0[:, 2])
  np.testing.assert_array_equal(out.frozen[...], np.ones(3))
  np.testing.assert_array_equal(model.w[...], w0)  # the input model is not changed


def test_before_step_sees_the_current_parameters_and_the_step():
  seen = []

  def before(model, x, y, step):
    seen.append((step, np.asarray(model.w[...]).copy()))
    return x

  x, y = data()
  every = jnp.ones((), bool)
  batches = [(jnp.asarray(x), jnp.asarray(y), every)] * 3
  out = classifier.trained_steps(
    Linear(nnx.Rngs(1)), TRAINED, optax.sgd(0.1), batches, before_step=before
  )
  assert [step for step, _ in seen] == [0, 1, 2]
  assert not np.array_equal(seen[0][1], seen[1][1])
  after_two = classifier.trained_steps(Linear(nnx.Rngs(1)), TRAINED, optax.sgd(0.1), batches[:2])
  np.testing.assert_array_equal(seen[2][1], after_two.w[...])
  assert not np.array_equal(out.w[...], after_two.w[...])


def test_batches_draw_without_replacement_unless_short():
  x = np.arange(10)[:, None]
  y = np.arange(10)
  for _, labels, _ in classifier.batches(np.random.default_rng(0), x, y, 20, 10, None):
    assert sorted(np.asarray(labels)) == list(range(10))  # every row once
  short = list(classifier.batches(np.random.default_rng(0), x[:3], y[:3], 5, 8, None))
  assert all(len(labels) == 8 for _, labels, _ in short)
