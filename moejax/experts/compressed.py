"""What the compressed expert types (quantized.py, codebook.py) share: their
non-trained variable kind, the supported bit-widths, grouping along a matrix's
input dimension, and bit packing for the byte report.

Storage. Codes (quantized) and indices (codebook) are uint8 arrays, one code
per byte, in memory and in checkpoints; `pack_bits` writes b-bit codes
b bits each (little-endian bit order, C order), the form whose size the byte
reports count. Nothing packs codes on the way into a checkpoint.

The weights dict an expert type hands to dispatch holds every array as a
float (moejax/experts/base.py: weights(float32) is float32); integer codes and
indices travel as exact floats and are read back with `as_index`.

Activation fake-quantization (setting act_bits of both types; CodeQuant, ICLR
2026, arXiv 2604.10496, quantizes weights AND activations, W4A4 / W4A8): the
input of every expert matmul (x before w_gate and w_up, the SwiGLU product
before w_down, after the codebook types' rotation) is rounded to act_bits in
the forward (`fake_quant`), per token (one scale per row over the whole input
dim), asymmetric min-max: scale = (max - min) / (2^b - 1), floored at 1e-5,
no clipping. These details are the released code's (SAI-Lab-NYU/CodeQuant,
utils/quantization_utils.py activation_quantizer with input_group_size -1),
not the paper's text. The gradient is the straight-through estimator (ours: the
released code never differentiates through it). act_bits 0: float inputs.
With act_bits > 0 the fused path is the 'loop' grouped matmul (`loop_fused`):
the SonicMoE block loop has no place for the quantizer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.assignment.blocks import loop_matmul_fn, schedule_of
from moejax.assignment.layout import combine_rows, dropless_metrics, tile_layout
from moejax.errors import ConfigError
from moejax.experts.swiglu import SwiGLUExperts

SUPPORTED_BITS = (2, 3, 4, 8)
ACT_BITS = (0, *SUPPORTED_BITS)  # activation bits; 0: float activations
MAX_LEVELS = 2 ** max(SUPPORTED_BITS)  # codes and indices fit one uint8
MATRICES = ("w_gate", "w_up", "w_down")  # SwiGLU: x @ w_gate, x @ w_up [d, f]; h @ w_down [f, d]
# Logical axes of codes / indices [E, d_in, d_out] (moejax/sharding.py). The FFN
# width is never split ('mlp' -> None): groups along expert_d_ff and w_down's
# input rotation need whole rows, so under tensor parallelism each tensor shard
# holds and runs whole experts (redundantly); experts split over the expert
# axis, d_model over fsdp (gathered inside expert parallelism, as for SwiGLU).
CODE_AXES = {
  "w_gate": ("expert", "embed", None),
  "w_up": ("expert", "embed", None),
  "w_down": ("expert", None, "embed"),
}


class CompressedWeight(nnx.Variable):
  """A compressed expert array: checkpointed with the model, never trained. Not
  an nnx.Param, so the trainer's optimizer never sees it (train/step.py
  split_model puts it in `rest`)."""


def check_bits(key: str, bits) -> None:
  """ConfigError naming `key` unless bits is one of SUPPORTED_BITS."""
  if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
    raise ConfigError(f"{key}={bits!r} is not supported; valid: {SUPPORTED_BITS}")


def check_act_bits(key: str, bits) -> None:
  """ConfigError naming `key` unless bits is one of ACT_BITS (0: float activations)."""
  if isinstance(bits, bool) or bits not in ACT_BITS:
    raise ConfigError(f"{key}={bits!r} is not supported; valid: {ACT_BITS}")


def fake_quant(x, bits: int, straight_through: bool = True):
  """x [..., d] rounded per row to `bits` (module doc: asymmetric min-max, one
  scale per row), gradient straight through (else that of the rounded value,
  whose rounding has none); x itself for bits 0."""
  if not bits:
    return x
  low = jnp.min(x, axis=-1, keepdims=True)
  scale = jnp.maximum((jnp.max(x, axis=-1, keepdims=True) - low) / (2**bits - 1), 1e-5)
  q = jnp.clip(jnp.round((x - low) / scale), 0, 2**bits - 1) * scale + low
  return x + jax.lax.stop_gradient(q - x) if straight_through else q


def quantized_inputs(matmul, bits: int):
  """matmul(v, w) with v fake-quantized to `bits` first (matmul itself for 0)."""
  if not bits:
    return matmul
  return lambda v, w: matmul(fake_quant(v, bits), w)


def loop_fused(apply, x, routing, cfg):
  """(y, metrics) of `apply(rows, matmul)` over the dropless layout with the 'loop'
  grouped matmul: a compressed type's fused path when it quantizes activations."""
  x = jnp.asarray(x)
  layout = tile_layout(routing, cfg.num_experts, cfg.dropless.tile)
  out = apply(x[layout.row_token], loop_matmul_fn(schedule_of(layout, cfg.dropless)))
  return combine_rows(out, layout, routing, x.dtype), dropless_metrics(layout)


def check_group_size(key: str, group_size) -> None:
  """ConfigError naming `key` unless group_size is an int >= 0 (0: one group per column)."""
  if (
    isinstance(group_size, bool)
    or not isinstance(group_size, (int, np.integer))
    or (group_size < 0)
  ):
    raise ConfigError(
      f"{key}={group_size!r} must be an integer >= 0 (0: one group "
      "spanning the whole input dimension)"
    )


def check_bool(key: str, value) -> None:
  if not isinstance(value, bool):
    raise ConfigError(f"{key}={value!r} must be True or False")


def group_size_for(key: str, group_size: int, dims: dict) -> dict:
  """{dim name: the group size along that input dim}: group_size itself, which
  must divide every one of `dims` ({name: size}); 0 means the whole dim."""
  bad = {name: n for name, n in dims.items() if group_size and n % group_size}
  if bad:
    sizes = ", ".join(f"{name}={n}" for name, n in bad.items())
    raise ConfigError(
      f"{key}={group_size} must divide the input dimension of every expert "
      f"matrix; it does not divide {sizes}"
    )
  return {name: group_size or n for name, n in dims.items()}


def expand_groups(a, d_in: int):
  """[..., G, d_out] -> [..., d_in, d_out]: each group's row repeated d_in / G times."""
  return jnp.repeat(a, d_in // a.shape[-2], axis=-2)


def as_index(values, levels: int):
  """Integer codes from their float form (rounded, clipped to [0, levels)), int32."""
  return jnp.clip(jnp.round(values), 0, levels - 1).astype(jnp.int32)


def compute_dtype(*arrays):
  """Dequantization runs in float32 (or wider, for a float64 reference)."""
  return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


def variable(value, logical_axes) -> CompressedWeight:
  return CompressedWeight(value, logical_axes=tuple(logical_axes))


def float_init(num_experts: int, d_model: int, d_ff: int, rngs: nnx.Rngs) -> dict:
  """{w_gate, w_up, w_down} float32: the SwiGLU type's own initialisation (the
  same draws as experts='swiglu' from the same rngs), to be compressed."""
  return SwiGLUExperts(num_experts, d_model, d_ff, rngs=rngs).weights(jnp.float32)


def pack_bits(codes, bits: int) -> np.ndarray:
  """uint8 [ceil(n bits / 8)]: the n = codes.size codes (< 2^bits), `bits` bits each."""
  codes = np.asarray(codes)
  if codes.size and (codes.min() < 0 or codes.max() >= 2**bits):
    raise ValueError(f"codes outside [0, 2^{bits}) cannot be packed in {bits} bits")
  planes = np.unpackbits(codes.astype(np.uint8).reshape(-1, 1), axis=1, bitorder="little")
  return np.packbits(planes[:, :bits].ravel(), bitorder="little")


def unpack_bits(packed, bits: int, shape) -> np.ndarray:
  """The uint8 codes [shape] that `pack_bits` packed."""
  n = int(np.prod(shape))
  planes = np.unpackbits(np.asarray(packed, np.uint8), count=n * bits, bitorder="little")
  planes = np.pad(planes.reshape(n, bits), ((0, 0), (0, 8 - bits)))
  return np.packbits(planes, axis=1, bitorder="little").reshape(shape)


def packed_nbytes(count: int, bits: int) -> int:
  """Bytes of `count` codes packed `bits` bits each (pack_bits)."""
  return int(-(-int(count) * int(bits) // 8))


def host(tree):
  return jax.tree.map(np.asarray, tree)
