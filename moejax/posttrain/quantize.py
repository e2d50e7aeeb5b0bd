"""Integer weight quantizers for one weight matrix: round to nearest (RTN) and
GPTQ (Frantar et al. 2022, arXiv 2210.17323, Alg. 1).

moejax stores a linear map as x @ W with W [d_in, d_out], so the input dim is
the row axis. Rows are grouped in blocks of `group_size`; group g and output
column j share one scale s[g, j] (and, asymmetric, one integer zero point z):

  asymmetric  range [min(w, 0), max(w, 0)] of the group's column (the GPTQ
              reference quantizer includes 0), s = range / (2^b - 1),
              z = round(-min / s), code q = clip(round(w / s) + z, 0, 2^b - 1)
              (uint8), w_hat = (q - z) s;
  symmetric   s = max |w| / (2^(b-1) - 1), q = clip(round(w / s), -qmax, qmax)
              (int8), w_hat = q s: the restricted range of 2^b - 1 levels, so
              |w - w_hat| <= s / 2 for every weight of the group.

GPTQ quantizes the rows (input dims) in order. With H = X^T X of the
calibration inputs X [N, d_in], damped by `damp` * mean(diag H), and U the
upper Cholesky factor of H^-1 (H^-1 = U^T U), row i is rounded and its error
e = (w_i - w_hat_i) / U_ii is fed back to the later rows, w_k -= U_ik e for
k > i (Alg. 1; the lazy batch of `block_size` rows only changes the order of
the updates). A group's scales are computed from its rows when the group starts
(the reference's static_groups=False), with every earlier error already fed
back. Differences from the reference (IST-DASLab/gptq): it reads a group that
starts inside a lazy block from the not yet updated matrix, so its result
depends on block_size; here blocks are rounded to a multiple of group_size and
the group is read after all earlier updates, so block_size changes nothing.
Dead inputs (H_ii = 0) get H_ii = 1 and a zero weight row, as in the reference.
Scales are rounded to float32 before they are used, GPTQ's algebra runs in
float64 on the host (offline, one matrix at a time); RTN is GPTQ with H = I.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.errors import ConfigError
from moejax.experts.compressed import SUPPORTED_BITS
from moejax.experts.quantized import dequantize as dequantize_codes


def check_grouping(bits: int, group_size: int, d_in: int) -> None:
  """ConfigError unless bits is in SUPPORTED_BITS and group_size divides d_in."""
  if bits not in SUPPORTED_BITS:
    raise ConfigError(f"bits={bits!r} is not supported; valid: {SUPPORTED_BITS}")
  if not isinstance(group_size, (int, np.integer)) or group_size <= 0 or d_in % group_size:
    raise ConfigError(
      f"group_size={group_size!r} must be a positive divisor of the input dimension d_in={d_in}"
    )


@dataclasses.dataclass
class QuantizedWeight:
  """Codes [d_in, d_out] (uint8 asymmetric, int8 symmetric), scales and zero
  points [d_in / group_size, d_out] (zero None when symmetric)."""

  codes: np.ndarray
  scales: np.ndarray
  zero: np.ndarray | None
  bits: int
  group_size: int

  @property
  def symmetric(self) -> bool:
    return self.zero is None

  def dequantize(self) -> np.ndarray:
    return dequantize(self)


def _group_params(rows_GxO: np.ndarray, bits: int, symmetric: bool):
  """(scale, zero) [d_out] of one group of rows (module doc), float64 holding
  float32 values for the scale; zero is None when symmetric."""
  rows = np.asarray(rows_GxO, np.float64)  # [..., G, d_out]: leading axes batch
  if symmetric:
    scale = np.abs(rows).max(axis=-2) / (2 ** (bits - 1) - 1)
    zero = None
  else:
    low = np.minimum(rows.min(axis=-2), 0.0)
    high = np.maximum(rows.max(axis=-2), 0.0)
    scale = (high - low) / (2**bits - 1)
  scale = np.where(scale > 0, scale, 1.0).astype(np.float32).astype(np.float64)
  if not symmetric:
    zero = np.round(-low / scale)
  return scale, zero


def _codes(w_O: np.ndarray, scale, zero, bits: int) -> np.ndarray:
  """Integer codes (float64) of one row under (scale, zero)."""
  if zero is None:
    top = 2 ** (bits - 1) - 1
    return np.clip(np.round(w_O / scale), -top, top)
  return np.clip(np.round(w_O / scale) + zero, 0, 2**bits - 1)


def _values(codes, scale, zero):
  return codes * scale if zero is None else (codes - zero) * scale


def _pack(codes, scales, zeros, bits, group_size, symmetric) -> QuantizedWeight:
  return QuantizedWeight(
    codes=np.asarray(codes, np.int8 if symmetric else np.uint8),
    scales=np.asarray(scales, np.float32),
    zero=None if symmetric else np.asarray(zeros, np.uint8),
    bits=bits,
    group_size=group_size,
  )


def dequantize(q: QuantizedWeight) -> np.ndarray:
  """W_hat [d_in, d_out] float32: (code - zero) * scale of each row's group, by
  the formula the 'quantized' expert type runs (experts/quantized.dequantize)."""
  return np.asarray(dequantize_codes(q.codes, q.scales, q.zero), np.float32)


def rtn(W, bits: int, group_size: int, symmetric: bool = False) -> QuantizedWeight:
  """Round each weight to the nearest level of its group's grid (module doc)."""
  W = np.asarray(W, np.float64)
  check_grouping(bits, group_size, W.shape[0])
  codes = np.empty_like(W)
  scales, zeros = [], []
  for start in range(0, W.shape[0], group_size):
    rows = W[start : start + group_size]
    scale, zero = _group_params(rows, bits, symmetric)
    codes[start : start + group_size] = _codes(rows, scale, zero, bits)
    scales.append(scale)
    zeros.append(zero)
  return _pack(codes, scales, None if symmetric else zeros, bits, group_size, symmetric)


def rtn_experts(W, bits: int, group_size: int, hessians=None, *, symmetric: bool = False):
  """The quantizer 'rtn' (methods.QUANTIZERS): `rtn` of each W[e] of W [E, d_in, d_out];
  it reads no hessians."""
  return [rtn(w, bits, group_size, symmetric=symmetric) for w in np.asarray(W)]


def gptq_experts(
  W, bits: int, group_size: int, hessians, *, symmetric: bool = False, damp: float = 0.01
):
  """The quantizer 'gptq' (methods.QUANTIZERS): `gptq_stack` of W [E, d_in, d_out]
  against hessians [E, d_in, d_in], one group per lazy block (block_size changes no
  result; the fewest in-block row updates)."""
  if hessians is None:
    raise ConfigError("quantizer 'gptq' needs the hessians X_e^T X_e of each expert's inputs")
  return gptq_stack(W, hessians, bits, group_size, damp, group_size, symmetric)


def input_hessian(X) -> np.ndarray:
  """H = X^T X [d_in, d_in] in float64 of calibration inputs X [..., d_in]."""
  X = np.asarray(X, np.float64)
  X = X.reshape(-1, X.shape[-1])
  return X.T @ X


def _inverse_cholesky(H: np.ndarray) -> np.ndarray:
  """Upper U with U^T U = H^-1."""
  lower = np.linalg.cholesky(H)
  identity = np.eye(len(H))
  inverse_lower = np.linalg.solve(lower, identity)  # L^-1; H^-1 = L^-T L^-1
  inverse = inverse_lower.T @ inverse_lower
  return np.linalg.cholesky((inverse + inverse.T) / 2).T


def gptq(
  W,
  H,
  bits: int,
  group_size: int,
  damp: float = 0.01,
  block_size: int = 128,
  symmetric: bool = False,
) -> QuantizedWeight:
  """GPTQ of W [d_in, d_out] against the input Hessian H = X^T X [d_in, d_in]:
  rows quantized in order, each one's error fed back through the inverse
  Hessian's Cholesky factor (module doc, Alg. 1)."""
  d_in = np.shape(W)[0]
  if np.shape(H) != (d_in, d_in):
    raise ConfigError(f"H has shape {np.shape(H)}; expected ({d_in}, {d_in}) for d_in={d_in}")
  return gptq_stack(
    np.asarray(W)[None], np.asarray(H)[None], bits, group_size, damp, block_size, symmetric
  )[0]


def gptq_stack(
  W,
  H,
  bits: int,
  group_size: int,
  damp: float = 0.01,
  block_size: int = 128,
  symmetric: bool = False,
) -> list[QuantizedWeight]:
  """`gptq` of every W[e] [d_in, d_out] against its own H[e], for W [E, d_in, d_out]
  and H [E, d_in, d_in]: the same arithmetic, the experts carried along a leading
  axis (one Python loop over the rows for all of them)."""
  W = np.array(W, np.float64)
  e, d_in, _ = W.shape
  check_grouping(bits, group_size, d_in)
  H = np.array(H, np.float64)
  if H.shape != (e, d_in, d_in):
    raise ConfigError(
      f"H has shape {H.shape}; expected ({e}, {d_in}, {d_in}) for {e} matrices of d_in={d_in}"
    )
  diagonal = np.arange(d_in)
  dead = H[:, diagonal, diagonal] == 0  # [E, d_in]
  H[:, diagonal, diagonal] = np.where(dead, 1.0, H[:, diagonal, diagonal])
  W[dead] = 0.0
  H[:, diagonal, diagonal] += damp * np.mean(H[:, diagonal, diagonal], axis=1, keepdims=True)
  U = np.stack([_inverse_cholesky(h) for h in H])
  block = max(block_size // group_size, 1) * group_size
  codes = np.empty_like(W)
  scale_groups, zero_groups = [], []
  for start in range(0, d_in, block):
    stop = min(start + block, d_in)
    rows = W[:, start:stop].copy()  # updated in place as errors arrive
    errors = np.zeros_like(rows)
    U_block = U[:, start:stop, start:stop]
    for i in range(stop - start):
      if (start + i) % group_size == 0:
        scale, zero = _group_params(rows[:, i : i + group_size], bits, symmetric)
        scale_groups.append(scale)
        zero_groups.append(zero)
      w = rows[:, i]  # [E, d_out]
      code = _codes(w, scale, zero, bits)
      codes[:, start + i] = code
      error = (w - _values(code, scale, zero)) / U_block[:, i, i, None]
      rows[:, i:] -= U_block[:, i, i:, None] * error[:, None, :]
      errors[:, i] = error
    W[:, stop:] -= np.einsum("eij,eio->ejo", U[:, start:stop, stop:], errors)  # lazy batch
  scales = np.stack(scale_groups, axis=1)  # [E, groups, d_out]
  zeros = None if symmetric else np.stack(zero_groups, axis=1)
  return [
    _pack(codes[k], scales[k], None if zeros is None else zeros[k], bits, group_size, symmetric)
    for k in range(e)
  ]


def layer_error(W, Wq, X) -> float:
  """||X W - X Wq||_F^2 (float64) for X [..., d_in]; Wq a dequantized weight or
  a QuantizedWeight."""
  if isinstance(Wq, QuantizedWeight):
    Wq = dequantize(Wq)
  X = np.asarray(X, np.float64)
  diff = X.reshape(-1, X.shape[-1]) @ (np.asarray(W, np.float64) - np.asarray(Wq, np.float64))
  return float(np.sum(diff**2))
