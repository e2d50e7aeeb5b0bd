"""Step's token-selective Taylor scores (moejax/posttrain/taylor.py): the per-token
terms against a parameter gradient, and the planted hard-few / easy-many layer."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from configs import lm_shakespeare_moe
from moejax.posttrain import expert_subset, taylor
from moejax.train.loop import init_state


def test_per_token_terms_sum_to_the_gradient_of_an_output_scale():
  """Scaling expert e's w_down by a scales its output: dL/da at a = 1 is the sum over
  tokens of <dL/dy_t, g_te E_e(x_t)>, which jax.grad gives through the parameters."""
  graphdef, state, _ = init_state(lm_shakespeare_moe.get_config("size=tiny"))
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
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

  expected = jax.grad(loss)([jnp.ones(8), jnp.ones(8)])
  for layer_terms, grad in zip(terms, expected):
    np.testing.assert_allclose(np.asarray(layer_terms).sum(0), np.asarray(grad),
                               rtol=1e-4, atol=1e-7)


def test_step_prunes_the_many_easy_expert_frequency_the_few_hard_one():
  """Expert A (0) serves 10 hard tokens with large terms, B (1) 90 easy tokens with
  small ones, C and D (2, 3) 40 middling tokens each; one expert per token."""
  loss, terms, expert = [], [], []
  for e, (count, token_loss, term) in enumerate([(10, 5.0, 1.0), (90, 0.1, 0.05),
                                                  (40, 1.0, 0.3), (40, 1.0, 0.3)]):
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
