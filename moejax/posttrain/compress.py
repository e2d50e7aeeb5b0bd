"""Trained float SwiGLU experts -> the variables of a compressed expert type:
'quantized' (moejax/experts/quantized.py: RTN or GPTQ codes,
moejax/posttrain/quantize.py) and 'codebook' (moejax/experts/codebook.py:
Lloyd's k-means per group, moejax/posttrain/codebook.py).

Input: {w_gate, w_up [E, d, f], w_down [E, f, d]} of one layer, float (the
'swiglu' type's weights). Output: {name: numpy array} with the names, shapes
and dtypes the type's module holds; QuantizedExperts.assign /
CodebookExperts.assign load it into a built layer. Each expert matrix
[d_in, d_out] is compressed on its own, offline, in float64 on the host.
`compress_model` fills a compressed model from a float one of the same config;
`storage_report` gives the bytes of every compressed layer of a model.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from flax import nnx

from moejax.errors import ConfigError, choice_error
from moejax.experts import codebook as codebook_type
from moejax.experts import quantized as quantized_type
from moejax.experts.compressed import MATRICES, check_bits
from moejax.layers.lookup import LookupTable
from moejax.posttrain import codebook, methods

QUANTIZERS = methods.INTEGER_QUANTIZERS  # the --quantizer names (methods.QUANTIZERS)
COMPRESSED = (quantized_type.QuantizedExperts, codebook_type.CodebookExperts)


def _per_expert_bits(bits, num_experts: int) -> np.ndarray:
  """int [E] from one bit-width or one per expert; each supported."""
  per = (
    np.broadcast_to(np.asarray(bits), (num_experts,)) if np.ndim(bits) == 0 else (np.asarray(bits))
  )
  if per.shape != (num_experts,):
    raise ConfigError(f"bits: {per.shape[0]} bit-widths for {num_experts} experts")
  for b in per:
    check_bits("bits", int(b))
  return per.astype(int)


def _stored(q):
  """(codes, zeros) uint8 of one QuantizedWeight, symmetric ones offset by 2^(b-1)."""
  if not q.symmetric:
    return q.codes, q.zero
  offset = 2 ** (q.bits - 1)
  return (
    (q.codes.astype(np.int16) + offset).astype(np.uint8),
    np.full(q.scales.shape, offset, np.uint8),
  )


def quantized_from_float(
  weights: Mapping,
  bits: int | Sequence[int],
  group_size: int = 0,
  *,
  symmetric: bool = False,
  quantizer: str = "rtn",
  hessians: Mapping | None = None,
  damp: float = 0.01,
) -> dict:
  """The 'quantized' type's arrays for float SwiGLU experts `weights`.

  bits: one bit-width or one per expert [E]. group_size: input rows per group
  (0: the whole input dim). quantizer: an integer quantizer of methods.QUANTIZERS
  ('rtn', 'gptq'), with `symmetric` and `damp` where it has them as settings; one
  that needs hessians (gptq) reads {matrix: H [E, d_in, d_in]} of each expert's
  inputs (X^T X of the tokens routed to it, quantize.input_hessian; w_gate and w_up
  see the same X).
  """
  method = methods.integer_quantizer(quantizer, "quantizer")
  if "hessians" in method.needs and (hessians is None or set(MATRICES) - set(hessians)):
    raise ConfigError(f"quantizer={quantizer!r} needs hessians for {MATRICES}")
  quantize = method.bind_from({"symmetric": symmetric, "damp": damp})
  per = _per_expert_bits(bits, np.shape(weights["w_gate"])[0])
  out = {"bits": per.astype(np.uint8)}
  for m in MATRICES:
    w = np.asarray(weights[m], np.float32)
    group = group_size or w.shape[1]
    parts: list[tuple] = [()] * len(per)
    for b in np.unique(per):  # every expert of one bit-width in one call (GPTQ: one pass)
      members = np.flatnonzero(per == b)
      h = None if hessians is None else np.asarray(hessians[m])[members]
      qs = quantize(w[members], int(b), group, h)
      for e, q in zip(members, qs):
        parts[int(e)] = (*_stored(q), q.scales)
    codes, zeros, scales = (np.stack(a) for a in zip(*parts))
    out.update({f"{m}_codes": codes, f"{m}_scales": scales.astype(np.float32), f"{m}_zeros": zeros})
  quantized_type.check_arrays(out)
  return out


def codebook_from_float(
  weights: Mapping,
  bits: int | Sequence[int],
  group_size: int = 0,
  *,
  rotation: str = "none",
  iterations: int = 100,
  init: str = "kmeans++",
  seed: int = 0,
  max_bits: int | None = None,
  calibration_inputs: Mapping | None = None,
  finetune_steps: int = 0,
  finetune_lr: float = 1e-2,
  finetune_optimizer: str = "sgd",
) -> dict:
  """The 'codebook' type's arrays: Lloyd's k-means (codebook.kmeans_group_quant)
  of each expert matrix at its expert's bits, of R^T W with rotation 'hadamard'
  (R = hadamard(d_in)); centroids padded to 2^max_bits per group (the layer's
  model.moe.codebook.bits; default the largest of bits).

  bits: one bit-width or one per expert [E]. With finetune_steps > 0, each
  expert matrix's centroids are then fine-tuned on its calibration inputs
  (codebook.finetune_centroids, the CodeQuant step: min ||X W - X W_hat||^2,
  indices fixed; on X R and R^T W when rotated, the same error): calibration_inputs
  {matrix: E arrays X_e [n_e, d_in]}, each expert's routed tokens (w_down's: the
  SwiGLU hidden activations); an expert with no tokens keeps its k-means book.
  Fine-tuned codebooks are re-sorted, their indices renumbered (w_hat unchanged).
  """
  if rotation not in codebook_type.ROTATIONS:
    raise choice_error("rotation", rotation, codebook_type.ROTATIONS)
  num_experts = np.shape(weights["w_gate"])[0]
  per = _per_expert_bits(bits, num_experts)
  top = int(per.max()) if max_bits is None else max_bits
  check_bits("max_bits", top)
  if per.max() > top:
    raise ConfigError(f"max_bits={top} is below the widest expert's bits={per.max()}")
  if finetune_steps and (
    calibration_inputs is None
    or set(MATRICES) - set(calibration_inputs)
    or any(len(calibration_inputs[m]) != num_experts for m in MATRICES)
  ):
    raise ConfigError(
      f"finetune_steps={finetune_steps} needs calibration_inputs "
      f"{{matrix: {num_experts} arrays}} for {MATRICES}"
    )
  kmeans = methods.QUANTIZERS.get("kmeans")
  out = {"bits": per.astype(np.uint8)}
  for m in MATRICES:
    w = np.asarray(weights[m], np.float32)
    group = group_size or w.shape[1]
    R = codebook_type.hadamard(w.shape[1]) if rotation == "hadamard" else None
    indices, centroids = [], []
    for e, (w_e, b) in enumerate(zip(w, per)):
      target = w_e if R is None else codebook.rotate(w_e, R)  # R^T W
      quantize = kmeans.bind(iterations=iterations, init=init, seed=seed + e)
      book = quantize(target[None], int(b), group, None)[0]
      idx, cent = book.indices, book.centroids
      x = (
        None
        if not finetune_steps or calibration_inputs is None  # checked above
        else np.asarray(calibration_inputs[m][e], np.float32)
      )
      if x is not None and len(x):
        x = x if R is None else (x.astype(np.float64) @ R).astype(np.float32)  # x @ R
        cent = codebook.finetune_centroids(
          x, target, idx, cent, group, finetune_steps, finetune_lr, optimizer=finetune_optimizer
        ).centroids
        order = np.argsort(cent, axis=-1, kind="stable")  # sorted again, indices renumbered
        rank = np.argsort(order, axis=-1)
        cent = np.take_along_axis(cent, order, -1)
        idx = (
          np.take_along_axis(rank, idx.reshape(len(cent), -1).astype(np.int64), -1)
          .reshape(idx.shape)
          .astype(np.uint8)
        )
      indices.append(idx)
      centroids.append(codebook_type.pad_centroids(cent, 2**top))
    out[f"{m}_indices"] = np.stack(indices)
    out[f"{m}_centroids"] = np.stack(centroids).astype(np.float32)
  codebook_type.check_arrays(out)
  return out


def compress_model(float_model, model, convert) -> None:
  """Make `model` (compressed experts) the compression of `float_model` (the same
  config with experts='swiglu'): every nnx.Param and L3 table layout copied from the
  same path, each compressed expert layer given convert(that layer's float weights),
  e.g. lambda w: quantized_from_float(w, 4, 32)."""
  float_vars = dict(nnx.iter_graph(float_model))
  for path, node in nnx.iter_graph(model):
    if isinstance(node, (nnx.Param, LookupTable)):
      node.set_value(float_vars[path][...])
    elif isinstance(node, COMPRESSED):
      weights = float_vars[path].weights(np.float32)
      node.assign(convert({k: np.asarray(v) for k, v in weights.items()}))


def storage_report(model) -> list[dict]:
  """Per compressed expert layer of `model` (path order): its packed bytes, the
  bytes it holds now (uint8 codes, one per byte) and float32 SwiGLU bytes."""
  rows = []
  for path, node in nnx.iter_graph(model):
    if isinstance(node, COMPRESSED):
      arrays = {k: np.asarray(v) for k, v in node.arrays().items()}
      codes = [a for k, a in arrays.items() if k.endswith(("_codes", "_indices"))]
      rows.append(
        {
          "path": "/".join(map(str, path)),
          "packed_bytes": node.packed_bytes(),
          "held_bytes": sum(a.nbytes for a in arrays.values()),
          "float32_bytes": 4 * sum(a.size for a in codes),
        }
      )
  return rows
