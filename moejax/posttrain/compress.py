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
  per_output_column: bool = False,
  recluster: bool = False,
  act_bits: int = 0,
  rotation_steps: int = 150,
) -> dict:
  """The arrays of the 'codebook' type ('codebook_rotated' for rotation='learned'):
  Lloyd's k-means (codebook.kmeans_group_quant) of each expert matrix at its
  expert's bits, of R^T W when rotated; centroids padded to 2^max_bits per group
  (the layer's model.moe.codebook.bits; default the largest of bits).

  rotation: 'none', 'hadamard' (R = hadamard(d_in)) or 'learned' (CodeQuant:
  codebook.learn_rotation per expert from the Hadamard matrix, identity for a dim
  that is not a power of two, on its calibration inputs, for activations at
  act_bits; w_gate and w_up share one, stored as in_rotation, w_down's as
  down_rotation). per_output_column: a codebook per output column of each group
  (CodeQuant's released default with group_size 0: one per output channel over
  the whole input). bits: one bit-width or one per expert [E]. With
  finetune_steps > 0, each expert matrix's centroids are then fine-tuned on its
  calibration inputs (codebook.finetune_centroids, the CodeQuant step: min
  ||X W - X W_hat||^2, indices fixed; on X R and R^T W when rotated, the same
  error), and with recluster its weights re-assigned (codebook.recluster):
  calibration_inputs {matrix: E arrays X_e [n_e, d_in]}, each expert's routed
  tokens (w_down's: the SwiGLU hidden activations); an expert with no tokens keeps
  its k-means book (and R0). Codebooks are sorted, indices renumbered.
  """
  if rotation not in (*codebook_type.ROTATIONS, "learned"):
    raise choice_error("rotation", rotation, (*codebook_type.ROTATIONS, "learned"))
  num_experts = np.shape(weights["w_gate"])[0]
  per = _per_expert_bits(bits, num_experts)
  top = int(per.max()) if max_bits is None else max_bits
  check_bits("max_bits", top)
  if per.max() > top:
    raise ConfigError(f"max_bits={top} is below the widest expert's bits={per.max()}")
  needs = finetune_steps or rotation == "learned"
  if needs and (
    calibration_inputs is None
    or set(MATRICES) - set(calibration_inputs)
    or any(len(calibration_inputs[m]) != num_experts for m in MATRICES)
  ):
    what = f"finetune_steps={finetune_steps}" if finetune_steps else "rotation='learned'"
    raise ConfigError(
      f"{what} needs calibration_inputs {{matrix: {num_experts} arrays}} for {MATRICES}"
    )
  w = {m: np.asarray(weights[m], np.float32) for m in MATRICES}
  inputs = {
    m: [np.asarray(calibration_inputs[m][e], np.float32) for e in range(num_experts)]
    if needs and calibration_inputs is not None  # checked above
    else [None] * num_experts
    for m in MATRICES
  }
  rotations = _rotations(w, per, rotation, inputs, act_bits, rotation_steps)
  out = {"bits": per.astype(np.uint8)}
  for m in MATRICES:
    group = group_size or w[m].shape[1]
    indices, centroids = [], []
    for e, (w_e, b) in enumerate(zip(w[m], per)):
      R = rotations[m][e]
      target = w_e if R is None else codebook.rotate(w_e, R)  # R^T W
      book = codebook.kmeans_group_quant(
        target,
        int(b),
        group,
        iterations=iterations,
        init=init,
        seed=seed + e,
        per_output_column=per_output_column,
      )
      idx, cent = book.indices, book.centroids
      x = inputs[m][e]
      if finetune_steps and x is not None and len(x):
        x = x if R is None else (x.astype(np.float64) @ R).astype(np.float32)  # x @ R
        cent = codebook.finetune_centroids(
          x, target, idx, cent, group, finetune_steps, finetune_lr, optimizer=finetune_optimizer
        ).centroids
        if recluster:
          idx, cent = codebook.recluster(target, cent, group, x)
      idx, cent = codebook.sort_book(idx, cent, group)
      indices.append(idx)
      centroids.append(codebook_type.pad_centroids(cent.reshape(-1, cent.shape[-1]), 2**top))
    out[f"{m}_indices"] = np.stack(indices)
    out[f"{m}_centroids"] = np.stack(centroids).astype(np.float32)
  if rotation == "learned":
    for m, key in codebook_type.ROTATION_KEYS.items():
      out[key] = np.stack(rotations[m]).astype(np.float32)
  codebook_type.check_arrays(out)
  return out


def _rotations(w, per, rotation, inputs, act_bits, steps) -> dict:
  """{matrix: E rotations R [d_in, d_in] (None: none)} of codebook_from_float."""
  num_experts = len(per)
  if rotation == "none":
    return {m: [None] * num_experts for m in MATRICES}
  if rotation == "hadamard":
    return {m: [codebook_type.hadamard(w[m].shape[1])] * num_experts for m in MATRICES}
  out = {}
  for m, joint in (("w_gate", ("w_gate", "w_up")), ("w_down", ("w_down",))):
    d = w[m].shape[1]
    R0 = codebook_type.hadamard(d) if d & (d - 1) == 0 else np.eye(d, dtype=np.float32)
    out[m] = [
      R0
      if x is None or not len(x)
      else codebook.learn_rotation(
        x, np.concatenate([w[j][e] for j in joint], 1), act_bits, int(b), steps=steps, R0=R0
      ).R
      for e, (x, b) in enumerate(zip(inputs[m], per))
    ]
  out["w_up"] = out["w_gate"]
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
