"""Step's token-selective Taylor scores (moejax/posttrain/taylor.py): the per-token
terms against a parameter gradient, the scores against any split of the windows
into batches, against single-expert ablation on a trained tiny MoE (the spec's
oracle), and the planted hard-few / easy-many layer."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
import pytest

from moejax.posttrain import expert_subset, taylor
from tests.posttrain.trained_tiny import mean_loss

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


@pytest.mark.integration
def test_per_token_terms_sum_to_the_gradient_of_an_output_scale(tiny_model):
  """Scaling expert e's w_down by a scales its output: dL/da at a = 1, L the summed
  loss, is the sum over tokens of <dL/dy_t, g_te E_e(x_t)>, which jax.grad gives
  through the parameters."""
  _, graphdef, state = tiny_model
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 12)), jnp.int32)
  token_loss, terms = taylor.token_taylor_terms(graphdef, state.params, state.rest, tokens)
  assert token_loss.shape == (2 * 11,)

  def loss(scales):
    params = jax.tree.map(lambda v: v, state.params)
    for layer, block in enumerate((0, 1)):
      w = params["blocks"][block]["ffn"]["experts"]["w_down"]
      params["blocks"][block]["ffn"]["experts"]["w_down"] = w * scales[layer][:, None, None]
    logits, _, _ = nnx.merge(graphdef, params, state.rest)(tokens)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), -1)
    return -jnp.sum(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

  expected = jax.grad(loss)([jnp.ones(8), jnp.ones(8)])
  for layer_terms, grad in zip(terms, expected):
    np.testing.assert_allclose(
      np.asarray(layer_terms).sum(0), np.asarray(grad), rtol=1e-4, atol=1e-7
    )


def test_step_prunes_the_many_easy_expert_frequency_the_few_hard_one():
  """Expert A (0) serves 10 hard tokens with large terms, B (1) 90 easy tokens with
  small ones, C and D (2, 3) 40 middling tokens each; one expert per token."""
  loss, terms, expert = [], [], []
  for e, (count, token_loss, term) in enumerate(
    [(10, 5.0, 1.0), (90, 0.1, 0.05), (40, 1.0, 0.3), (40, 1.0, 0.3)]
  ):
    loss += [token_loss] * count
    expert += [e] * count
    row = np.zeros(4)
    row[e] = term
    terms += [row] * count
  loss, terms = np.array(loss), np.array(terms)
  frequency = np.bincount(expert, minlength=4)
  assert expert_subset.top_by_score(frequency, 3) == (1, 2, 3)  # frequency drops A
  scores = taylor.step_scores(loss, terms, rho=0.3)  # 54 tokens: A's 10, then C's and D's
  assert expert_subset.top_by_score(scores, 3) == (0, 2, 3)  # Step drops B
  assert scores[1] == 0.0  # none of B's easy tokens is selected


@pytest.mark.integration
def test_scores_do_not_depend_on_how_the_windows_are_batched(tiny_model):
  """Five windows as one batch, as batches of 2, 2, 1 and in the reverse order of
  1, 2, 2: each batch's per-token terms stay paired with its own losses (a term
  paired with another batch's loss selects other tokens) and carry the same scale
  (the gradient of the summed loss: a batch of one is not weighted 5x)."""
  _, graphdef, state = tiny_model
  windows = np.random.default_rng(3).integers(0, 256, (5, 12)).astype(np.int32)

  def score(batches):
    return taylor.layer_step_scores(graphdef, state.params, state.rest, batches, rho=0.25)

  whole = score([windows])
  for batches in (
    [windows[:2], windows[2:4], windows[4:]],
    [windows[4:], windows[2:4], windows[:2]],
  ):
    for got, want in zip(score(batches), whole):
      np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6 * np.abs(want).max())
  token_loss, terms = taylor.token_taylor_terms(
    graphdef, state.params, state.rest, jnp.asarray(windows)
  )
  rows = np.asarray(terms[0]).reshape(5, 12, -1)[:, :-1].reshape(55, -1)
  np.testing.assert_allclose(
    whole[0], taylor.step_scores(np.asarray(token_loss), rows, 0.25), rtol=1e-6
  )


@pytest.mark.integration
def test_scores_rank_single_expert_ablation_on_a_trained_model(trained_tiny):
  """The spec's oracle: on the tiny MoE trained on a bigram chain, Step's scores
  (top 25% of tokens by loss) rank the loss change of ablating each of the 16
  experts alone (its output zeroed, what the Taylor term linearises) with
  Spearman > 0.8."""
  from scipy.stats import spearmanr
  from moejax.posttrain.calibration import STEP_RHO

  _, graphdef, params, rest, windows = trained_tiny
  scores = np.concatenate(taylor.layer_step_scores(graphdef, params, rest, [windows], STEP_RHO))
  loss = jax.jit(mean_loss, static_argnums=0)
  base = float(loss(graphdef, params, rest, windows))
  zeroed = []
  for block in (0, 1):
    for e in range(8):
      ablated = jax.tree.map(lambda v: v, params)
      w_down = ablated["blocks"][block]["ffn"]["experts"]["w_down"] = w_down_of(params, block)
      w_down[e] = 0.0
      zeroed.append(float(loss(graphdef, ablated, rest, windows)) - base)
  correlation = spearmanr(scores, zeroed)[0]
  print(f"Step scores vs single-expert ablation: Spearman {correlation:.3f}")
  assert correlation > 0.8
  assert np.max(zeroed) > 0.01  # the ablations move the loss (not all ties at 0)


def w_down_of(params, block):
  return np.array(params["blocks"][block]["ffn"]["experts"]["w_down"])
