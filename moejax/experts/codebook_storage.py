"""The arrays of the 'codebook' and 'codebook_rotated' expert types on the host: their
layout checks and their bit-packed form (moejax/experts/codebook.py holds the type).

`packed_bytes` counts `pack`: per expert and matrix ceil(bits_e n / 8) bytes of
indices and 4 bytes for each of the 2^bits_e used centroids per group (the unused
tail, its last used centroid repeated by `pad_centroids`, is implied), one byte of
bits per expert, nothing for a Hadamard rotation (regenerated from the size) and 4
bytes an entry for learned rotations.
"""

from __future__ import annotations

import numpy as np

from moejax.experts import compressed as cz

# The learned rotation of each matrix's input ('codebook_rotated').
ROTATION_KEYS = {"w_gate": "in_rotation", "w_up": "in_rotation", "w_down": "down_rotation"}


def pad_centroids(centroids, levels: int) -> np.ndarray:
  """centroids [..., k] -> [..., levels]: the last one repeated (the unused tail)."""
  centroids = np.asarray(centroids)
  tail = np.repeat(centroids[..., -1:], levels - centroids.shape[-1], axis=-1)
  return np.concatenate([centroids, tail], axis=-1)


def check_arrays(arrays: dict) -> None:
  """ValueError unless the arrays are this type's: dtypes and shapes; Kmax (the
  centroids per group) and every bits[e] supported, bits[e] <= log2(Kmax);
  every index of expert e < 2^bits[e]; the tail beyond 2^bits[e] its last
  used centroid repeated (`pad_centroids`, what `unpack` restores); learned
  rotations ('codebook_rotated') float32 [E, n, n] of each input dim n."""
  bits = np.asarray(arrays["bits"])
  for m, key in ROTATION_KEYS.items():
    if key in arrays:
      R, n = np.asarray(arrays[key]), np.shape(arrays[f"{m}_indices"])[1]
      if R.dtype != np.float32 or R.shape != (bits.shape[0], n, n):
        raise ValueError(f"{key}: {R.dtype} {R.shape}, want float32 {(bits.shape[0], n, n)}")
  if bits.dtype != np.uint8 or bits.ndim != 1:
    raise ValueError(f"bits must be uint8 [E]; got {bits.dtype} {bits.shape}")
  for b in np.unique(bits):
    cz.check_bits("bits", int(b))
  for m in cz.MATRICES:
    indices, centroids = np.asarray(arrays[f"{m}_indices"]), np.asarray(arrays[f"{m}_centroids"])
    if indices.dtype != np.uint8 or centroids.dtype != np.float32:
      raise ValueError(
        f"{m}: indices must be uint8, centroids float32; got {indices.dtype}, {centroids.dtype}"
      )
    levels = centroids.shape[-1]
    cz.check_bits(f"{m} centroids per group: log2", int(np.log2(levels)))
    if (
      2 ** int(np.log2(levels)) != levels
      or centroids.ndim != 3
      or indices.ndim != 3
      or not centroids.shape[0] == indices.shape[0] == bits.shape[0]
      or not _fits(indices.shape[1:], centroids.shape[1])
    ):
      raise ValueError(
        f"{m}: indices {indices.shape}, centroids {centroids.shape}, bits "
        f"{bits.shape} do not fit together"
      )
    for e, b in enumerate(bits.astype(int)):
      if 2**b > levels:
        raise ValueError(
          f"{m}: expert {e} has bits={b} but its codebooks hold {levels} "
          f"centroids (at most {int(np.log2(levels))} bits)"
        )
      if np.any(indices[e] >= 2**b):
        raise ValueError(
          f"{m}: expert {e} has indices outside [0, 2^bits) = [0, {2**b}) "
          f"(max {int(indices[e].max())})"
        )
      if not np.array_equal(centroids[e], pad_centroids(centroids[e, :, : 2**b], levels)):
        raise ValueError(
          f"{m}: expert {e} at {b} bits: its centroids beyond the first "
          f"{2**b} must repeat the last used one"
        )


def _fits(matrix: tuple, rows: int) -> bool:
  """Whether `rows` codebooks per expert fit a [d_in, d_out] matrix: G groups
  dividing d_in, or G * d_out per-column books."""
  d_in, d_out = matrix
  return d_in % rows == 0 or (rows % d_out == 0 and d_in % (rows // d_out) == 0)


def packed_bytes(arrays: dict) -> int:
  """Bytes of `pack(arrays)` (module doc), from the shapes and bits."""
  bits = np.asarray(arrays["bits"]).astype(int)
  total = bits.size  # one byte of bits per expert
  for m in cz.MATRICES:
    indices, centroids = np.shape(arrays[f"{m}_indices"]), np.shape(arrays[f"{m}_centroids"])
    for b in bits:
      total += cz.packed_nbytes(int(np.prod(indices[1:])), b) + 4 * centroids[1] * 2**b
  return total + sum(4 * int(np.prod(np.shape(arrays[k]))) for k in _rotation_keys(arrays))


def _rotation_keys(arrays) -> list:
  return sorted(set(ROTATION_KEYS.values()) & set(arrays))


def pack(arrays: dict) -> dict:
  """The bit-packed form: bits uint8 [E], and per expert and matrix its indices
  at its own bits (uint8 vector) and its used centroids [G, 2^bits[e]] float32."""
  bits = np.asarray(arrays["bits"]).astype(np.uint8)
  out: dict[str, np.ndarray | list[np.ndarray]] = {"bits": bits}
  for m in cz.MATRICES:
    centroids = np.asarray(arrays[f"{m}_centroids"], np.float32)
    out[f"{m}_centroids"] = [centroids[e, :, : 2 ** int(b)] for e, b in enumerate(bits)]
    out[f"{m}_indices"] = [cz.pack_bits(a, int(b)) for a, b in zip(arrays[f"{m}_indices"], bits)]
  out.update({k: np.asarray(arrays[k], np.float32) for k in _rotation_keys(arrays)})
  return out


def unpack(packed: dict, shapes: dict) -> dict:
  """The arrays `pack` packed; shapes: {name: shape} of the indices and centroids."""
  bits = np.asarray(packed["bits"])
  out = {"bits": bits}
  for m in cz.MATRICES:
    levels = shapes[f"{m}_centroids"][-1]
    out[f"{m}_centroids"] = np.stack(
      [pad_centroids(c, levels) for c in packed[f"{m}_centroids"]]
    ).astype(np.float32)
    out[f"{m}_indices"] = np.stack(
      [
        cz.unpack_bits(p, int(b), shapes[f"{m}_indices"][1:])
        for p, b in zip(packed[f"{m}_indices"], bits)
      ]
    )
  out.update({k: np.asarray(packed[k], np.float32) for k in _rotation_keys(packed)})
  return out
