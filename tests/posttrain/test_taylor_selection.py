"""Step's token selection (moejax/posttrain/taylor.py step_scores) at its edges: a
rho that rounds to no token still keeps the single hardest one, a rho of 1 keeps
every token, ties go to the earlier token, and a rho that rounds up by one token
adds exactly that token."""

import numpy as np
import pytest

from moejax.posttrain import taylor


def terms_and_loss():
  """7 tokens, 3 experts; token 4 is the hardest, then 1, then 6."""
  loss = np.array([0.1, 2.0, 0.3, 0.2, 5.0, 0.05, 1.0])
  terms = np.arange(21.0).reshape(7, 3) - 10.0  # signed: the score is sum |term|
  return loss, terms


@pytest.mark.parametrize("rho", [1e-6, 0.01, 1 / 7 - 1e-9])
def test_a_rho_below_one_token_keeps_exactly_the_hardest_token(rho):
  loss, terms = terms_and_loss()
  np.testing.assert_array_equal(taylor.step_scores(loss, terms, rho), np.abs(terms[4]))


def test_rho_one_keeps_every_token_and_rounding_adds_the_next_hardest():
  loss, terms = terms_and_loss()
  np.testing.assert_array_equal(taylor.step_scores(loss, terms, 1.0), np.abs(terms).sum(0))
  # 2.6 / 7 * 7 = 2.6 rounds to 3 tokens: 4, 1, 6; 2.4 rounds to 2: 4, 1
  np.testing.assert_array_equal(
    taylor.step_scores(loss, terms, 2.6 / 7), np.abs(terms[[4, 1, 6]]).sum(0)
  )
  np.testing.assert_array_equal(
    taylor.step_scores(loss, terms, 2.4 / 7), np.abs(terms[[4, 1]]).sum(0)
  )


def test_equal_losses_select_the_earlier_token():
  loss = np.array([1.0, 3.0, 3.0, 0.0])
  terms = np.diag([1.0, 10.0, 100.0, 1000.0])
  np.testing.assert_array_equal(taylor.step_scores(loss, terms, 0.25), [0.0, 10.0, 0.0, 0.0])
