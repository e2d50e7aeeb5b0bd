"""Packing: documents + separators -> stream -> windows, losslessly."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from moejax.data.packing import PackedWindows, pack_documents

documents = st.lists(st.lists(st.integers(1, 255), max_size=40), max_size=8)


@given(documents, st.integers(1, 16))
def test_windows_concatenate_to_the_stream(docs, seq_len):
  stream = pack_documents([np.array(d) for d in docs], separator_id=0)
  np.testing.assert_array_equal(stream, [t for d in docs for t in d + [0]])
  assert stream.dtype == np.int32

  windows = PackedWindows(stream, seq_len)
  assert len(windows) == len(stream) // (seq_len + 1)
  rebuilt = [windows.window(i) for i in range(len(windows))]
  np.testing.assert_array_equal(
    np.concatenate(rebuilt or [np.zeros([0], np.int32)]), stream[: len(windows) * (seq_len + 1)]
  )
  for i in range(len(windows)):
    example = windows[i]
    assert example['inputs'].shape == example['targets'].shape == (seq_len,)
    np.testing.assert_array_equal(example['inputs'], windows.window(i)[:-1])
    np.testing.assert_array_equal(example['targets'], windows.window(i)[1:])


def test_every_document_ends_with_the_separator():
  stream = pack_documents([np.array([5, 6]), np.array([], np.int32), np.array([7])], 0)
  np.testing.assert_array_equal(stream, [5, 6, 0, 0, 7, 0])
