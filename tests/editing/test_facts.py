"""Fact edits are checked against the facts domain before anything is edited
(moejax/editing/facts.py): a subject the corpus does not hold, an unknown attribute and
an empty target are refused in one line naming the value."""

import pytest

from moejax.editing import facts
from moejax.errors import ConfigError


@pytest.mark.parametrize(
  "subject, attribute, target, message",
  [
    ("Nobody Atall", "pet", "toad", "the subject 'Nobody Atall' is missing from the model's facts"),
    (None, "favourite_hat", "toad", "attribute 'favourite_hat' is not known"),
    (None, "pet", " ", "target ' ' must be a non-empty value"),
  ],
)
def test_a_bad_fact_is_refused_in_one_line_naming_it(subject, attribute, target, message):
  subject = subject or next(iter(facts.people()))  # a subject the corpus holds
  with pytest.raises(ConfigError) as error:
    facts.make_fact(subject, attribute, target, where=" (edits.jsonl, line 3)")
  text = str(error.value)
  assert message in text and "edits.jsonl, line 3" in text and "\n" not in text


def test_a_fact_the_corpus_holds_is_accepted():
  subject = next(iter(facts.people()))
  fact = facts.make_fact(subject, "pet", "toad")
  assert (fact.subject, fact.attribute, fact.target) == (subject, "pet", "toad")
