"""SwiGLU experts held as per-group k-means codebooks: expert type 'codebook'
(CodeQuant, ICLR 2026, arXiv 2604.10496; moejax/posttrain/codebook.py).

Each of w_gate, w_up [E, d, f] and w_down [E, f, d] is stored as uint8 indices
of the same shape and centroids [E, d_in / g, Kmax], Kmax = 2^bits with bits
the setting (the widest allowed): the group of g input rows (x @ W: the row
axis) across every output column shares one sorted codebook, and
w_hat[r, j] = centroids[r // g, index[r, j]] (`decode`).

Bits per expert (uint8 [E], `bits`; as the 'quantized' type): expert e uses
only the first 2^bits[e] centroids of each of its groups, its indices lie in
[0, 2^bits[e]), and the unused tail of each codebook repeats its last used
centroid (`pad_centroids`: the codebook stays sorted, the tail is never
indexed). decode and lut_matmul read only indexed centroids, so bits change
nothing in the function; `check_arrays` and the byte report read them. Mixed
widths give fractional averages, e.g. 2.5 bits = half the experts at 2 bits,
half at 3.

Rotation (model.moe.codebook.rotation): 'none', or 'hadamard': the stored
codebooks approximate R^T W with R = hadamard(d_in) (regenerated from the
size, never stored), so that x @ W = (x @ R) @ (R^T W). The expert function,
which defines the type, rotates its input, x @ R, and computes the LUT matmul
(`lut_matmul`: per group, the bucket sums of x over the rows holding each
index, times the centroids). The grouped-matmul form and the fused path
(SwiGLU's SonicMoE block loop) decode the codebooks to dense [E, d_in, d_out]
with R folded in, R @ w_hat: the same function (the contract tests compare
them with the per-token loop of the LUT form). The gathered form (a decode step's
rows, experts/gathered.py) rotates the rows and reads only their experts' indices.
Sharding: compressed.CODE_AXES (experts split, the FFN width never: w_down's
rotation mixes all its rows).

decode, lut_matmul and hadamard live here, once; the offline maths
(posttrain/codebook.py: k-means, fine-tuning) imports them. `build` gives
the SwiGLU type's random initialisation (rotated) quantile codebooks with
each weight at its nearest centroid (the 'quantile' start of k-means, no
Lloyd iterations), every expert at the setting's bits; trained experts are
converted by Lloyd's k-means (bits per expert, optional centroid fine-tuning)
in moejax/posttrain/compress.py and loaded with CodebookExperts.assign.

Settings (model.moe.codebook): bits (2, 3, 4, 8), group_size (0: one group
per whole matrix; else it must divide d_model and expert_d_ff), rotation
('hadamard' needs power-of-two d_model and expert_d_ff; dims are checked when
the layer is built), decode_kernel (gathered.DECODE_KERNELS), act_bits (every
matmul's input, after the rotation, fake-quantized per token:
compressed.fake_quant; 0: float), per_output_column (a codebook per output
column of each group, centroids [E, G * d_out, Kmax]: CodeQuant's released
default with group_size 0; decoded by XLA on the gathered path).

Expert type 'codebook_rotated' (CodeQuant's learned rotation): the same
functions and settings but rotation, and two more arrays, in_rotation [E, d, d]
(the input of w_gate and w_up) and down_rotation [E, f, f] (w_down's), the
learned orthogonal R of each expert input (posttrain/codebook.learn_rotation),
applied online: x @ R, then the quantizer, then the LUT matmul. Its byte report
counts them at 4 bytes an entry.

Bytes: indices are held one per uint8 byte in memory and in checkpoints, and
every codebook at Kmax entries. The host-side layout checks and the bit-packed
form (`check_arrays`, `pack`, `unpack`, `packed_bytes`) are in
moejax/experts/codebook_storage.py.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.errors import ConfigError, choice_error
from moejax.experts import compressed as cz
from moejax.experts import gathered as gz
from moejax.experts.base import ExpertType, register_expert_type
from moejax.experts.codebook_storage import (  # noqa: F401  (part of this type's interface)
  ROTATION_KEYS,
  check_arrays,
  pack,
  packed_bytes,
  pad_centroids,
  unpack,
)
from moejax.experts.swiglu import swiglu_experts, swiglu_fused
from moejax.registry import settings_of

NAME = "codebook"
ROTATED = "codebook_rotated"
SETTINGS: dict[str, Any] = {
  "bits": 4,
  "group_size": 0,
  "rotation": "none",
  "decode_kernel": "auto",
  "act_bits": 0,
  "per_output_column": False,
}
ROTATED_SETTINGS = {k: v for k, v in SETTINGS.items() if k != "rotation"}
ROTATIONS = ("none", "hadamard")
RUNTIME = ("decode_kernel", "act_bits")  # settings read where the layer runs, not at build
HIGHEST = jax.lax.Precision.HIGHEST
LOGICAL_AXES = {
  **{f"{m}_indices": cz.CODE_AXES[m] for m in cz.MATRICES},
  **{f"{m}_centroids": ("expert", None, None) for m in cz.MATRICES},
}
# 'codebook_rotated': a learned rotation of each expert's inputs, [E, n, n]
# (w_gate and w_up read the same x, so they share one).
ROTATED_AXES = {**LOGICAL_AXES, **{k: ("expert", None, None) for k in ROTATION_KEYS.values()}}


def hadamard(n: int) -> np.ndarray:
  """Sylvester's Hadamard matrix / sqrt(n) [n, n] float32 (orthogonal)."""
  if not isinstance(n, (int, np.integer)) or n < 1 or n & (n - 1):
    raise ConfigError(f"hadamard n={n!r}: must be a power of two")
  H = np.ones((1, 1))
  while len(H) < n:
    H = np.block([[H, H], [H, -H]])
  return (H / np.sqrt(n)).astype(np.float32)


def decode(indices, centroids, group_size: int):
  """W_hat [d_in, d_out] = the centroid each index names in its group (jnp,
  differentiable in the centroids); centroids [G, K], or [G, d_out, K] with a
  codebook per output column of a group."""
  d_in, d_out = indices.shape
  centroids = jnp.asarray(centroids)
  blocks = jnp.asarray(indices, jnp.int32).reshape(d_in // group_size, group_size, d_out)
  group = jnp.arange(d_in // group_size)[:, None, None]
  if centroids.ndim == 3:
    values = centroids[group, jnp.arange(d_out)[None, None, :], blocks]
  else:
    values = centroids[group, blocks]
  return values.reshape(d_in, d_out)


def lut_matmul(x, indices, centroids, group_size: int):
  """x @ decode(indices, centroids) via bucket sums: for group g, output j and
  centroid c, S[g, j, c] = sum of x over the rows of g whose index is c, and
  y_j = sum_g sum_c centroids[g, (j,) c] S[g, j, c] (jnp, float32 or wider)."""
  dtype = cz.compute_dtype(x, centroids)
  x = jnp.asarray(x, dtype)
  d_in, d_out = indices.shape
  G, K = d_in // group_size, centroids.shape[-1]
  lead = x.shape[:-1]
  x_GxNxR = x.reshape(-1, G, group_size).transpose(1, 0, 2)
  idx_GxRxO = jnp.asarray(indices, jnp.int32).reshape(G, group_size, d_out)
  cent = jnp.asarray(centroids, dtype)
  cent_GxOxK = cent if cent.ndim == 3 else cent[:, None, :]

  def one_group(y, group):
    x_g, idx_g, c_g = group
    members = (idx_g[..., None] == jnp.arange(K)).astype(dtype)  # [R, O, K]
    buckets = jnp.einsum("nr,rok->nok", x_g, members, precision=HIGHEST)
    return y + jnp.sum(buckets * c_g[None], axis=-1), None

  y0 = jnp.zeros((x_GxNxR.shape[1], d_out), dtype)
  y, _ = jax.lax.scan(one_group, y0, (x_GxNxR, idx_GxRxO, cent_GxOxK))
  return y.reshape(*lead, d_out)


def rotation_matrix(rotation: str, n: int, dtype):
  """R [n, n] of the setting (None for 'none')."""
  return None if rotation == "none" else jnp.asarray(hadamard(n), dtype)


def rotate(v, rotation: str):
  """v @ R of the setting (v itself for 'none')."""
  R = rotation_matrix(rotation, v.shape[-1], v.dtype)
  return v if R is None else jnp.matmul(v, R, precision=HIGHEST)


def input_rotation(weights: dict, m: str, rotation: str, n: int, dtype):
  """R of matrix m's input: the stored learned one ([E, n, n] or one expert's [n, n],
  'codebook_rotated'), else the setting's (None for 'none')."""
  key = ROTATION_KEYS[m]
  if key in weights:
    return jnp.asarray(weights[key], dtype)
  return rotation_matrix(rotation, n, dtype)


def book(indices, centroids, per_output_column: bool):
  """(centroids as `decode` reads them, group size) of one matrix [d_in, d_out]:
  stored centroids [G, K], or [G * d_out, K] with per_output_column (a codebook per
  output column of each group, rows in (group, column) order)."""
  d_in, d_out = indices.shape[-2:]
  rows, levels = centroids.shape[-2:]
  if per_output_column:
    rows //= d_out
    centroids = centroids.reshape(*centroids.shape[:-2], rows, d_out, levels)
  return centroids, d_in // rows


def codebook_expert(
  weights_e: dict,
  x,
  *,
  rotation: str = "none",
  act_bits: int = 0,
  per_output_column: bool = False,
  **settings,
):
  """One expert on rows x [n, d]: SwiGLU whose every matmul is (v @ R), then
  fake-quantized to act_bits (compressed.fake_quant), then the LUT matmul of
  its codebook (the group size and K are read from the shapes)."""
  del settings

  def project(v, m):
    centroids = weights_e[f"{m}_centroids"]
    indices = cz.as_index(weights_e[f"{m}_indices"], centroids.shape[-1])
    centroids, group_size = book(indices, centroids, per_output_column)
    R = input_rotation(weights_e, m, rotation, v.shape[-1], v.dtype)
    v = v if R is None else jnp.matmul(v, R, precision=HIGHEST)
    return lut_matmul(cz.fake_quant(v, act_bits), indices, centroids, group_size).astype(x.dtype)

  return project(jax.nn.silu(project(x, "w_gate")) * project(x, "w_up"), "w_down")


def dense_weights(
  weights: dict, dtype, rotation: str, per_output_column: bool = False, fold: bool = True
) -> dict:
  """{w_gate, w_up, w_down} [E, d_in, d_out] decoded, with R folded in (R @ w_hat)
  unless not `fold`."""
  out = {}
  for m in cz.MATRICES:
    centroids = weights[f"{m}_centroids"]
    indices = cz.as_index(weights[f"{m}_indices"], centroids.shape[-1])
    w = jax.vmap(lambda i, c: decode(i, *book(i, c, per_output_column)))(indices, centroids)
    R = input_rotation(weights, m, rotation, w.shape[-2], w.dtype) if fold else None
    out[m] = (w if R is None else jnp.matmul(R, w, precision=HIGHEST)).astype(dtype)
  return out


def codebook_experts(
  weights: dict,
  rows,
  matmul,
  *,
  rotation: str = "none",
  act_bits: int = 0,
  per_output_column: bool = False,
  **settings,
):
  """Rows grouped by expert: the grouped matmuls on the decoded weights, R folded
  in; with act_bits, the rows rotated (a grouped matmul for learned rotations),
  fake-quantized, then multiplied by the decoded weights."""
  del settings
  if not act_bits:
    return swiglu_experts(
      dense_weights(weights, rows.dtype, rotation, per_output_column), rows, matmul
    )
  dense = dense_weights(weights, rows.dtype, rotation, per_output_column, fold=False)

  def project(v, m):
    R = input_rotation(weights, m, rotation, v.shape[-1], v.dtype)
    if R is not None:
      v = matmul(v, R) if R.ndim == 3 else jnp.matmul(v, R, precision=HIGHEST)
    return matmul(cz.fake_quant(v, act_bits), dense[m])

  return swiglu_experts({m: m for m in cz.MATRICES}, rows, project)


def codebook_fused(
  weights: dict,
  x,
  routing,
  cfg,
  *,
  rotation: str = "none",
  act_bits: int = 0,
  per_output_column: bool = False,
  **settings,
):
  """SwiGLU's fused path (SonicMoE block loop) on the decoded, rotated weights;
  with act_bits the 'loop' grouped matmul instead (compressed.loop_fused)."""
  del settings
  if act_bits:
    apply = functools.partial(
      codebook_experts,
      weights,
      rotation=rotation,
      act_bits=act_bits,
      per_output_column=per_output_column,
    )
    return cz.loop_fused(apply, x, routing, cfg)
  dense = dense_weights(weights, x.dtype, rotation, per_output_column)
  return swiglu_fused(dense, x, routing, cfg)


def dense_rows(x, row_expert, indices, centroids, per_output_column: bool = False):
  """x[r] @ decode(expert row_expert[r]) [R, d_out]: only the rows' experts'
  indices gathered and decoded (the XLA form of the gathered path)."""
  books = centroids[row_expert]
  index = cz.as_index(indices[row_expert], books.shape[-1])
  w_hat = jax.vmap(lambda i, c: decode(i, *book(i, c, per_output_column)))(index, books)
  return jnp.einsum("ra,rab->rb", x, w_hat.astype(x.dtype))


def codebook_gathered(
  weights,
  rows,
  row_expert,
  *,
  rotation="none",
  decode_kernel="auto",
  act_bits=0,
  per_output_column=False,
  **_,
):
  """Row r through expert row_expert[r]: rotated rows (by its expert's learned R
  when stored), fake-quantized, then the rows' experts' LUT matmuls. Per-column
  codebooks decode by XLA (the FFI lookup kernel reads one book per group)."""

  def prepare(v, m):
    R = input_rotation(weights, m, rotation, v.shape[-1], v.dtype)
    if R is not None and R.ndim == 3:
      v = jnp.einsum("ra,rab->rb", v, R[row_expert], precision=HIGHEST)
    elif R is not None:
      v = jnp.matmul(v, R, precision=HIGHEST)
    return cz.fake_quant(v, act_bits)

  rows_fn = functools.partial(dense_rows, per_output_column=per_output_column)
  kernel = "xla" if per_output_column else decode_kernel
  parts = ("indices", "centroids")
  return gz.swiglu_rows(weights, rows, row_expert, "lookup", parts, rows_fn, kernel, prepare)


def quantile_codebook(w, bits: int, group_size: int, per_output_column: bool = False):
  """jnp, for `build`: centroids at the (k + 1/2) / K quantiles of each group of w
  [..., d_in, d_out] ([..., G, K]; [..., G * d_out, K] with a book per output
  column) and uint8 indices of the nearest one."""
  *lead, d_in, d_out = w.shape
  blocks = w.reshape(*lead, d_in // group_size, group_size, d_out)
  if per_output_column:
    values = jnp.swapaxes(blocks, -1, -2)  # [..., G, d_out, g]
  else:
    values = blocks.reshape(*lead, d_in // group_size, 1, group_size * d_out)
  levels = 2**bits
  centroids = jnp.moveaxis(
    jnp.quantile(values, (jnp.arange(levels) + 0.5) / levels, axis=-1), 0, -1
  )
  middle = (centroids[..., 1:] + centroids[..., :-1]) / 2
  indices = jnp.sum(values[..., None] > middle[..., None, :], axis=-1)
  if per_output_column:
    indices = jnp.swapaxes(indices, -1, -2)
  centroids = centroids.reshape(*lead, -1, levels)
  return indices.reshape(w.shape).astype(jnp.uint8), centroids.astype(jnp.float32)


class CodebookExperts(nnx.Module):
  """E SwiGLU experts of width d_ff as codebook indices, centroids and bits [E]."""

  LOGICAL_AXES = LOGICAL_AXES
  NAME = NAME

  def __init__(
    self,
    num_experts: int,
    d_model: int,
    d_ff: int,
    *,
    bits: int,
    group_size: int,
    rotation: str = "none",
    per_output_column: bool = False,
    rngs: nnx.Rngs,
  ):
    dims = {"d_model": d_model, "expert_d_ff": d_ff}
    groups = cz.group_size_for(f"model.moe.{self.NAME}.group_size", group_size, dims)
    if rotation == "hadamard" and any(n & (n - 1) for n in dims.values()):
      raise ConfigError(
        f"model.moe.{self.NAME}.rotation='hadamard' needs power-of-two input "
        f"dims; d_model={d_model}, expert_d_ff={d_ff}"
      )
    weights = cz.float_init(num_experts, d_model, d_ff, rngs)
    learned = {}
    for m in cz.MATRICES:
      w = weights[m]
      R = self.start_rotation(rotation, w.shape[-2], w.dtype)
      if m in ROTATION_KEYS and ROTATION_KEYS[m] in self.LOGICAL_AXES:
        learned[ROTATION_KEYS[m]] = jnp.broadcast_to(R, (num_experts, *R.shape))
      w = w if R is None else jnp.einsum("ba,ebo->eao", R, w, precision=HIGHEST)  # R^T W
      indices, centroids = quantile_codebook(
        w, bits, groups["expert_d_ff" if m == "w_down" else "d_model"], per_output_column
      )
      setattr(self, f"{m}_indices", cz.variable(indices, LOGICAL_AXES[f"{m}_indices"]))
      setattr(self, f"{m}_centroids", cz.variable(centroids, LOGICAL_AXES[f"{m}_centroids"]))
    for key, R in learned.items():
      setattr(self, key, cz.variable(R, self.LOGICAL_AXES[key]))
    self.bits = cz.variable(jnp.full((num_experts,), bits, jnp.uint8), ("expert",))

  @staticmethod
  def start_rotation(rotation: str, n: int, dtype):
    return rotation_matrix(rotation, n, dtype)

  def arrays(self) -> dict:
    """{name: stored array}: indices and centroids of each matrix, and bits [E]."""
    return {name: getattr(self, name)[...] for name in (*self.LOGICAL_AXES, "bits")}

  def weights(self, dtype) -> dict:
    """The compressed arrays as float32 (indices exact); decoded in float32 and
    cast to the compute dtype where used, so `dtype` changes nothing here."""
    del dtype
    return {name: getattr(self, name)[...].astype(jnp.float32) for name in self.LOGICAL_AXES}

  def assign(self, arrays: dict) -> None:
    """Hold `arrays` (compress.codebook_from_float), checked, same shapes (the same
    names: learned rotations for 'codebook_rotated' only); codebooks
    narrower than this layer's Kmax (2^model.moe.codebook.bits) are padded to it
    (`pad_centroids`: w_hat and the packed form unchanged)."""
    check_arrays(arrays)
    if set(arrays) != {*self.LOGICAL_AXES, "bits"}:
      raise ValueError(
        f"arrays {sorted(arrays)}; expert type {self.NAME!r} holds "
        f"{sorted({*self.LOGICAL_AXES, 'bits'})}"
      )
    arrays = dict(arrays)
    for m in cz.MATRICES:
      levels = getattr(self, f"{m}_centroids").shape[-1]
      if np.shape(arrays[f"{m}_centroids"])[-1] < levels:
        arrays[f"{m}_centroids"] = pad_centroids(arrays[f"{m}_centroids"], levels)
    for name, value in arrays.items():
      variable = getattr(self, name)
      if np.shape(value) != variable.shape:
        raise ValueError(f"{name}: shape {np.shape(value)}, the layer holds {variable.shape}")
      variable.set_value(jnp.asarray(value, variable.dtype))

  def packed_bytes(self) -> int:
    return packed_bytes(cz.host(self.arrays()))


class RotatedCodebookExperts(CodebookExperts):
  """CodebookExperts with a learned rotation of each expert's inputs (CodeQuant):
  in_rotation [E, d, d] (w_gate, w_up), down_rotation [E, f, f] (w_down); built
  at Hadamard (identity for a dim that is not a power of two)."""

  LOGICAL_AXES = ROTATED_AXES
  NAME = ROTATED

  @staticmethod
  def start_rotation(rotation: str, n: int, dtype):
    del rotation
    return jnp.asarray(hadamard(n) if n & (n - 1) == 0 else np.eye(n), dtype)


def validate_codebook(section, name: str = NAME) -> None:
  cz.check_bits(f"model.moe.{name}.bits", section["bits"])
  cz.check_group_size(f"model.moe.{name}.group_size", section["group_size"])
  if name == NAME and section["rotation"] not in ROTATIONS:
    raise choice_error(f"model.moe.{name}.rotation", section["rotation"], ROTATIONS)
  kernel = section.get("decode_kernel", SETTINGS["decode_kernel"])  # older configs lack it
  gz.check_decode_kernel(f"model.moe.{name}.decode_kernel", kernel)
  cz.check_act_bits(f"model.moe.{name}.act_bits", section.get("act_bits", 0))
  cz.check_bool(f"model.moe.{name}.per_output_column", section.get("per_output_column", False))


def build_codebook(num_experts: int, d_model: int, cfg, *, rngs) -> CodebookExperts:
  """Quantile codebooks of the SwiGLU init at model.moe.codebook settings."""
  s = settings_of(cfg, NAME, SETTINGS)
  validate_codebook(s)
  for key in RUNTIME:  # read where the layer runs
    del s[key]
  return CodebookExperts(num_experts, d_model, cfg.expert_d_ff, rngs=rngs, **s)


def build_rotated(num_experts: int, d_model: int, cfg, *, rngs) -> RotatedCodebookExperts:
  """Quantile codebooks of the rotated SwiGLU init at model.moe.codebook_rotated settings."""
  s = settings_of(cfg, ROTATED, ROTATED_SETTINGS)
  validate_codebook(s, ROTATED)
  for key in RUNTIME:
    del s[key]
  return RotatedCodebookExperts(num_experts, d_model, cfg.expert_d_ff, rngs=rngs, **s)


def rotated_experts(weights: dict, rows, matmul, **settings):
  """'codebook_rotated''s apply: codebook_experts, as a function of its own
  (experts_of tells registered types apart by their apply)."""
  return codebook_experts(weights, rows, matmul, **settings)


def _register(name, build, logical_axes, settings, validate, apply) -> ExpertType:
  return register_expert_type(
    ExpertType(
      name,
      build=build,
      logical_axes=logical_axes,
      expert=codebook_expert,
      apply=apply,
      fused=codebook_fused,
      gathered=codebook_gathered,
      code_levels={f"{m}_indices": 2 ** SETTINGS["bits"] for m in cz.MATRICES},
      settings=settings,
      validate=validate,
    )
  )


CODEBOOK = _register(
  NAME, build_codebook, LOGICAL_AXES, SETTINGS, validate_codebook, codebook_experts
)
CODEBOOK_ROTATED = _register(
  ROTATED,
  build_rotated,
  ROTATED_AXES,
  ROTATED_SETTINGS,
  functools.partial(validate_codebook, name=ROTATED),
  rotated_experts,
)
