"""SwiGLU experts held as integer codes: expert type 'quantized'.

Each of w_gate, w_up [E, d, f] and w_down [E, f, d] is stored as uint8 codes of
the same shape, and per group of `group_size` input rows (x @ W: the row axis)
and output column, a float32 scale and a uint8 zero point, [E, d_in / g, d_out]
each. A weight is (Frantar et al. 2022, arXiv 2210.17323, the GPTQ grid of
moejax/posttrain/quantize.py)

    w_hat = (code - zero) * scale                                 (`dequantize`)

the one copy of this formula (posttrain/quantize.dequantize calls it).
Symmetric codes are stored offset by 2^(b-1), with zero = 2^(b-1). Expert e
has its own bit-width bits[e] (uint8 [E]): codes and zeros lie in
[0, 2^bits[e]); w_hat does not depend on bits, which only the range check
(`check_arrays`) and the byte report (`packed_bytes`) read.

The codes, scales, zeros and bits are CompressedWeight variables, not
nnx.Params: saved in checkpoints, never trained; codes and zero points are read
as integers (`cz.as_index`: no gradient flows to them). The expert function,
the grouped-matmul form and the fused path (SwiGLU's SonicMoE block loop) all
dequantize in float32 inside the traced computation and cast w_hat to the
compute dtype; XLA materialises w_hat [E, d, f] for the layer call: memory is
saved in storage, not in the layer's peak. The gathered form (a decode step's
few rows, experts/gathered.py) reads only the rows' experts' codes instead:
through the FFI kernel 'affine' (kernels/cpu_gathered.py) or `dense_rows`.
Sharding: compressed.CODE_AXES (experts split, the FFN width never).

`build` quantizes the SwiGLU type's random initialisation (the same draws as
experts='swiglu' from the same seed) by round to nearest, every expert at
model.moe.quantized.bits; trained float experts are converted offline by
moejax/posttrain/compress.py (RTN or GPTQ, bits per expert), and
QuantizedExperts.assign loads them.

Settings (model.moe.quantized): bits (2, 3, 4, 8), group_size (0: the whole
input dim, one group per column; else it must divide d_model and
expert_d_ff, checked when the layer is built), symmetric, decode_kernel
(gathered.DECODE_KERNELS: how a decode step's rows are computed), act_bits
(0: float activations; else every matmul's input fake-quantized per token,
compressed.fake_quant: W4A4 / W4A8 as CodeQuant's baselines).

Bytes: codes are held one per uint8 byte in memory and in checkpoints.
`packed_bytes` counts the bit-packed form `pack` writes: per expert and
matrix ceil(bits_e n / 8) bytes of codes, the same for asymmetric zero points
(symmetric ones are implied), 4 per scale, one byte of bits per expert.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.experts import compressed as cz
from moejax.experts import gathered as gz
from moejax.experts.base import ExpertType, register_expert_type
from moejax.experts.swiglu import swiglu_experts, swiglu_fused
from moejax.registry import settings_of

NAME = "quantized"
SETTINGS: dict[str, Any] = {
  "bits": 4,
  "group_size": 0,
  "symmetric": False,
  "decode_kernel": "auto",
  "act_bits": 0,
}
LOGICAL_AXES = {
  **{f"{m}_codes": cz.CODE_AXES[m] for m in cz.MATRICES},
  **{
    f"{m}_{part}": ("expert", None, cz.CODE_AXES[m][2])
    for m in cz.MATRICES
    for part in ("scales", "zeros")
  },
}


def dequantize(codes, scales, zeros=None):
  """w_hat [..., d_in, d_out] = (code - zero) * scale of each row's group; codes
  [..., d_in, d_out], scales and zeros [..., d_in / g, d_out] (zeros None: 0).
  float32 (float64 for a float64 scale)."""
  dtype = cz.compute_dtype(scales)
  codes = jnp.asarray(codes).astype(dtype)
  if zeros is not None:
    codes = codes - cz.expand_groups(jnp.asarray(zeros).astype(dtype), codes.shape[-2])
  return codes * cz.expand_groups(jnp.asarray(scales).astype(dtype), codes.shape[-2])


def dense_weights(weights: dict, dtype) -> dict:
  """{w_gate, w_up, w_down} dequantized, in `dtype`, from this type's weights."""
  return {
    m: dequantize(
      cz.as_index(weights[f"{m}_codes"], cz.MAX_LEVELS),
      weights[f"{m}_scales"],
      cz.as_index(weights[f"{m}_zeros"], cz.MAX_LEVELS),
    ).astype(dtype)
    for m in cz.MATRICES
  }


def dense_rows(x, row_expert, codes, scales, zeros):
  """x[r] @ w_hat[row_expert[r]] [R, d_out]: only the rows' experts' codes
  gathered and dequantized (the XLA form of the gathered path)."""
  w_hat = dequantize(
    cz.as_index(codes[row_expert], cz.MAX_LEVELS),
    scales[row_expert],
    cz.as_index(zeros[row_expert], cz.MAX_LEVELS),
  )
  return jnp.einsum("ra,rab->rb", x, w_hat.astype(x.dtype))


def quantized_expert(weights_e: dict, x, *, act_bits: int = 0, **settings):
  """One expert on rows x [n, d]: SwiGLU of its dequantized weights, each matmul's
  input fake-quantized to act_bits (compressed.fake_quant; 0: float). The group
  size is read from the shapes; the other settings change nothing here."""
  del settings
  matmul = cz.quantized_inputs(jnp.matmul, act_bits)
  return swiglu_experts(dense_weights(weights_e, x.dtype), x, matmul)


def quantized_experts(weights: dict, rows, matmul, *, act_bits: int = 0, **settings):
  """Rows grouped by expert: the grouped matmuls on the dequantized weights."""
  del settings
  return swiglu_experts(
    dense_weights(weights, rows.dtype), rows, cz.quantized_inputs(matmul, act_bits)
  )


def quantized_fused(weights: dict, x, routing, cfg, *, act_bits: int = 0, **settings):
  """SwiGLU's fused path (SonicMoE block loop) on the dequantized weights; with
  act_bits the 'loop' grouped matmul instead (compressed.loop_fused)."""
  del settings
  if act_bits:
    apply = functools.partial(quantized_experts, weights, act_bits=act_bits)
    return cz.loop_fused(apply, x, routing, cfg)
  return swiglu_fused(dense_weights(weights, x.dtype), x, routing, cfg)


def quantized_gathered(
  weights: dict, rows, row_expert, *, decode_kernel="auto", act_bits: int = 0, **settings
):
  """Row r through expert row_expert[r], reading only those experts' codes (gathered.py)."""
  del settings
  parts = ("codes", "scales", "zeros")
  prepare = (lambda v, m: cz.fake_quant(v, act_bits)) if act_bits else None
  return gz.swiglu_rows(
    weights, rows, row_expert, "affine", parts, dense_rows, decode_kernel, prepare
  )


def rtn(w, bits: int, group_size: int, symmetric: bool):
  """Round to nearest on the grid of posttrain/quantize.py, in jnp float32 (so
  that `build` traces): w [..., d_in, d_out] -> (codes uint8, scales float32,
  zeros uint8), groups of `group_size` input rows."""
  *lead, d_in, d_out = w.shape
  blocks = jnp.asarray(w, jnp.float32).reshape(*lead, d_in // group_size, group_size, d_out)
  if symmetric:
    scale = jnp.max(jnp.abs(blocks), axis=-2) / (2 ** (bits - 1) - 1)
  else:
    low = jnp.minimum(blocks.min(axis=-2), 0.0)
    scale = (jnp.maximum(blocks.max(axis=-2), 0.0) - low) / (2**bits - 1)
  scale = jnp.where(scale > 0, scale, 1.0)
  zero = jnp.full_like(scale, 2 ** (bits - 1)) if symmetric else jnp.round(-low / scale)
  codes = jnp.clip(
    jnp.round(blocks / scale[..., None, :]) + zero[..., None, :], 1 if symmetric else 0, 2**bits - 1
  )
  return (
    codes.reshape(w.shape).astype(jnp.uint8),
    scale.astype(jnp.float32),
    zero.astype(jnp.uint8),
  )


def check_arrays(arrays: dict) -> None:
  """ValueError unless the arrays are this type's (shapes agree, bits supported,
  every code and zero point of expert e in [0, 2^bits[e]))."""
  bits = np.asarray(arrays["bits"])
  for b in np.unique(bits):
    cz.check_bits("bits", int(b))
  for m in cz.MATRICES:
    codes, scales, zeros = (np.asarray(arrays[f"{m}_{p}"]) for p in ("codes", "scales", "zeros"))
    if codes.dtype != np.uint8 or zeros.dtype != np.uint8 or scales.dtype != np.float32:
      raise ValueError(
        f"{m}: codes and zeros must be uint8, scales float32; got "
        f"{codes.dtype}, {zeros.dtype}, {scales.dtype}"
      )
    E, d_in, _ = codes.shape
    if (
      scales.shape != zeros.shape
      or scales.shape[::2] != codes.shape[::2]
      or (d_in % scales.shape[1])
      or bits.shape != (E,)
    ):
      raise ValueError(
        f"{m}: codes {codes.shape}, scales {scales.shape}, zeros "
        f"{zeros.shape}, bits {bits.shape} do not fit together"
      )
    top = (2 ** bits.astype(np.int64))[:, None, None]
    if np.any(codes >= top) or np.any(zeros >= top):
      raise ValueError(f"{m}: codes or zero points outside [0, 2^bits) of their expert")


def packed_bytes(arrays: dict, symmetric: bool) -> int:
  """Bytes of `pack(arrays, symmetric)` (module doc), from the shapes and bits."""
  bits = np.asarray(arrays["bits"]).astype(int)
  total = bits.size  # one byte of bits per expert
  for m in cz.MATRICES:
    codes, scales = np.shape(arrays[f"{m}_codes"]), np.shape(arrays[f"{m}_scales"])
    total += 4 * int(np.prod(scales))
    for b in bits:
      total += cz.packed_nbytes(int(np.prod(codes[1:])), b)
      total += 0 if symmetric else cz.packed_nbytes(int(np.prod(scales[1:])), b)
  return total


def pack(arrays: dict, symmetric: bool) -> dict:
  """The bit-packed form: bits uint8 [E], scales as they are, and per expert a
  uint8 vector of its codes (and asymmetric zero points) at its own bits."""
  bits = np.asarray(arrays["bits"]).astype(np.uint8)
  out: dict[str, np.ndarray | list[np.ndarray]] = {"bits": bits}
  for m in cz.MATRICES:
    out[f"{m}_scales"] = np.asarray(arrays[f"{m}_scales"], np.float32)
    for part in ("codes",) if symmetric else ("codes", "zeros"):
      out[f"{m}_{part}"] = [cz.pack_bits(a, int(b)) for a, b in zip(arrays[f"{m}_{part}"], bits)]
  return out


def unpack(packed: dict, shapes: dict, symmetric: bool) -> dict:
  """The arrays `pack` packed; shapes: {name: shape} of the codes (and scales)."""
  bits = np.asarray(packed["bits"])
  out = {"bits": bits}
  for m in cz.MATRICES:
    scales = np.asarray(packed[f"{m}_scales"])
    out[f"{m}_scales"] = scales
    out[f"{m}_codes"] = np.stack(
      [
        cz.unpack_bits(p, int(b), shapes[f"{m}_codes"][1:])
        for p, b in zip(packed[f"{m}_codes"], bits)
      ]
    )
    out[f"{m}_zeros"] = (
      np.stack(
        [cz.unpack_bits(p, int(b), scales.shape[1:]) for p, b in zip(packed[f"{m}_zeros"], bits)]
      )
      if not symmetric
      else np.broadcast_to((2 ** (bits.astype(np.int64) - 1))[:, None, None], scales.shape).astype(
        np.uint8
      )
    )
  return out


class QuantizedExperts(nnx.Module):
  """E SwiGLU experts of width d_ff as codes, scales, zero points and bits."""

  LOGICAL_AXES = LOGICAL_AXES

  def __init__(
    self,
    num_experts: int,
    d_model: int,
    d_ff: int,
    *,
    bits: int,
    group_size: int,
    symmetric: bool,
    rngs: nnx.Rngs,
  ):
    self.symmetric = symmetric
    groups = cz.group_size_for(
      f"model.moe.{NAME}.group_size", group_size, {"d_model": d_model, "expert_d_ff": d_ff}
    )
    weights = cz.float_init(num_experts, d_model, d_ff, rngs)
    for m in cz.MATRICES:
      group = groups["expert_d_ff" if m == "w_down" else "d_model"]
      for part, value in zip(("codes", "scales", "zeros"), rtn(weights[m], bits, group, symmetric)):
        setattr(self, f"{m}_{part}", cz.variable(value, LOGICAL_AXES[f"{m}_{part}"]))
    self.bits = cz.variable(jnp.full((num_experts,), bits, jnp.uint8), ("expert",))

  def arrays(self) -> dict:
    """{name: stored array}: codes, scales, zeros of each matrix, and bits [E]."""
    return {name: getattr(self, name)[...] for name in (*LOGICAL_AXES, "bits")}

  def weights(self, dtype) -> dict:
    """The compressed arrays as float32 (codes exact); dequantized in float32
    and cast to the compute dtype where used, so `dtype` changes nothing here."""
    del dtype
    return {name: getattr(self, name)[...].astype(jnp.float32) for name in LOGICAL_AXES}

  def assign(self, arrays: dict) -> None:
    """Hold `arrays` (compress.quantized_from_float), checked, same shapes; a
    symmetric layer's zero points must be the implied 2^(bits - 1)."""
    check_arrays(arrays)
    implied = (2 ** (np.asarray(arrays["bits"]).astype(np.int64) - 1))[:, None, None]
    if self.symmetric and any(
      np.any(np.asarray(arrays[f"{m}_zeros"]) != implied) for m in cz.MATRICES
    ):
      raise ValueError(
        "a symmetric layer (model.moe.quantized.symmetric) holds zero points "
        "2^(bits - 1) only; these arrays are asymmetric"
      )
    for name, value in arrays.items():
      variable = getattr(self, name)
      if np.shape(value) != variable.shape:
        raise ValueError(f"{name}: shape {np.shape(value)}, the layer holds {variable.shape}")
      variable.set_value(jnp.asarray(value, variable.dtype))

  def packed_bytes(self) -> int:
    return packed_bytes(cz.host(self.arrays()), self.symmetric)


def validate_quantized(section) -> None:
  cz.check_bits(f"model.moe.{NAME}.bits", section["bits"])
  cz.check_group_size(f"model.moe.{NAME}.group_size", section["group_size"])
  cz.check_bool(f"model.moe.{NAME}.symmetric", section["symmetric"])
  kernel = section.get("decode_kernel", SETTINGS["decode_kernel"])  # older configs lack it
  gz.check_decode_kernel(f"model.moe.{NAME}.decode_kernel", kernel)
  cz.check_act_bits(f"model.moe.{NAME}.act_bits", section.get("act_bits", 0))


def build_quantized(num_experts: int, d_model: int, cfg, *, rngs) -> QuantizedExperts:
  """RTN of the SwiGLU init at model.moe.quantized.{bits, group_size, symmetric}."""
  s = settings_of(cfg, NAME, SETTINGS)
  validate_quantized(s)
  del s["decode_kernel"], s["act_bits"]  # read where the layer runs
  return QuantizedExperts(num_experts, d_model, cfg.expert_d_ff, rngs=rngs, **s)


QUANTIZED = register_expert_type(
  ExpertType(
    NAME,
    build=build_quantized,
    logical_axes=LOGICAL_AXES,
    expert=quantized_expert,
    apply=quantized_experts,
    fused=quantized_fused,
    gathered=quantized_gathered,
    code_levels={
      f"{m}_{part}": 2 ** SETTINGS["bits"] for m in cz.MATRICES for part in ("codes", "zeros")
    },
    settings=SETTINGS,
    validate=validate_quantized,
  )
)
