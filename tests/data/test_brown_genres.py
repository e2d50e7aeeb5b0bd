"""Brown genre passages (moejax/data/brown_genres.py): every passage is a slice of a
document of its own genre, genres in equal numbers, the same passages for one seed,
and a genre without a long enough document is refused by name."""

import numpy as np
import pytest

from moejax.data.brown_genres import passages
from moejax.errors import ConfigError

DOCUMENTS = {
  "fiction": ["once upon a time there was a byte", "short"],
  "news": ["the market rose by three points today", "rain fell on the city all night long"],
}


def test_each_passage_is_a_slice_of_a_document_of_its_genre():
  genres = sorted(DOCUMENTS)
  tokens, labels = passages(DOCUMENTS, genres, 10, 25, seed=3)
  assert tokens.shape == (50, 10) and tokens.dtype == np.int32
  assert np.bincount(labels).tolist() == [25, 25]
  for row, label in zip(tokens, labels):
    text = row.astype(np.uint8).tobytes().decode()
    assert any(text in doc for doc in DOCUMENTS[genres[label]] if len(doc) >= 10)
  # the start offsets cover more than one place (the check is not vacuous)
  assert len({row.tobytes() for row in tokens[labels == 1]}) > 5


def test_one_seed_gives_the_same_passages_and_another_seed_others():
  genres = sorted(DOCUMENTS)
  first, again, other = (passages(DOCUMENTS, genres, 8, 6, seed) for seed in (1, 1, 2))
  np.testing.assert_array_equal(first[0], again[0])
  assert not np.array_equal(first[0], other[0])


def test_a_genre_without_a_long_enough_document_is_refused_by_name():
  with pytest.raises(ConfigError, match="genre 'fiction' has no document of at least 40"):
    passages(DOCUMENTS, sorted(DOCUMENTS), 40, 2, seed=0)
