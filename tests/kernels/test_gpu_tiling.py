"""Triton tile fitting to shared memory (pure Python; the compiled kernel needs a GPU).

On an H200 the f32 (128, 128, 128) gmm asked Triton for 262,144 bytes of
shared memory (232,448 available) and failed to compile; bf16 fitted.
"""

import pytest

from moejax.kernels import gmm_gpu


def stage_bytes(tiling, itemsize, contraction_axis):
  tm, tk, tn = tiling
  other = tm * tn if contraction_axis == 0 else tk * tn
  return (tm * tk + other) * itemsize * gmm_gpu.NUM_STAGES


@pytest.mark.parametrize(
  "itemsize,axis,expected",
  [
    (4, 1, (128, 64, 128)),  # f32 gmm: halve tk once (131,072 bytes)
    (2, 1, (128, 128, 128)),  # bf16 gmm fits as asked
    (4, 0, (64, 128, 128)),  # f32 tgmm contracts over rows: halve tm
    (2, 0, (128, 128, 128)),
  ],
)
def test_contracted_tile_is_halved_until_it_fits(itemsize, axis, expected):
  got = gmm_gpu.fit_shared_memory((128, 128, 128), itemsize, contraction_axis=axis)
  assert got == expected
  assert stage_bytes(got, itemsize, axis) <= gmm_gpu.SHARED_MEMORY_BUDGET
  assert stage_bytes((128, 128, 128), 4, axis) == 262_144  # the figure seen on the H200


def test_never_shrinks_below_the_triton_minimum():
  got = gmm_gpu.fit_shared_memory((16, 4096, 4096), 4, contraction_axis=1)
  assert got == (16, gmm_gpu.MIN_TRITON_DOT_TILE, 4096)
