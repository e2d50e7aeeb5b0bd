"""Mode spectra of TD-MoE's Tucker model (moejax/posttrain/tucker.py) at unequal mode
sizes, against the eigenvalues of each mode's Gram matrix."""

import numpy as np
import pytest

from moejax.posttrain import tucker as tk


@pytest.mark.parametrize("shape", [(2, 3, 7), (9, 2, 3), (3, 8, 2)])
def test_mode_spectra_are_the_eigenvalues_of_each_modes_gram_at_unequal_sizes(shape):
  """Distinct sizes, one mode larger than the product of the other two: its
  unfolding has fewer singular values than the mode's size, and the spectrum is
  padded with zeros to that size. Oracle: the eigenvalues of M_k M_k^T (d_k of
  them), M_k the mode-k unfolding built here."""
  t = np.random.default_rng(sum(shape)).normal(size=shape)
  spectra = tk.mode_spectra(t)
  for mode, size in enumerate(shape):
    unfolding = np.moveaxis(t, mode, 0).reshape(size, -1)
    want = np.sort(np.linalg.eigvalsh(unfolding @ unfolding.T))[::-1]
    assert spectra[mode].shape == (size,)
    np.testing.assert_allclose(spectra[mode], want, atol=1e-9 * want[0])
