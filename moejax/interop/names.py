"""Which HF tensor holds which moejax parameter, for every family.

A TensorMap ties one moejax array (a path in the params or rest tree of
moejax/models/decoder.py) to its HF tensor(s):
  - one tensor, or one per expert stacked along axis 0 (HF stores
    `experts.{e}.gate_proj.weight` per expert; moejax holds w_gate [E, d, f]);
  - `transpose`: HF Linear weights are [out, in], moejax kernels [in, out].
The families differ only in a few names: Mixtral's `block_sparse_moe` with
w1/w3/w2, Qwen2-MoE's `shared_expert` (+ `shared_expert_gate`), DeepSeek-V3's
`shared_experts` and `gate.e_score_correction_bias`, and MLA's projections.
"""

import dataclasses

from moejax.models.structure import expert_counts, moe_layer_indices

EXPERT_NAMES = {"mixtral": {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}}
DEFAULT_EXPERT_NAMES = {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}
MOE_PREFIX = {"mixtral": "block_sparse_moe"}
SHARED_PREFIX = {"qwen2_moe": "shared_expert", "deepseek_v3": "shared_experts"}
GQA_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
MLA_NAMES = {
  "q": "q_proj",
  "q_a": "q_a_proj",
  "q_b": "q_b_proj",
  "kv_a": "kv_a_proj_with_mqa",
  "kv_b": "kv_b_proj",
  "o": "o_proj",
}
MLA_NORMS = {"q_a_norm": "q_a_layernorm", "kv_a_norm": "kv_a_layernorm"}
FFN_NAMES = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


@dataclasses.dataclass(frozen=True)
class TensorMap:
  path: tuple  # keys into the params (or rest) tree
  hf_names: tuple[str, ...]  # one name, or one per expert (stacked on axis 0)
  transpose: bool = False
  collection: str = "params"  # 'params' (nnx.Param) or 'rest' (router state)
  stacked: bool = False  # one HF tensor per expert

  def hf_shape(self, moejax_shape: tuple) -> tuple:
    """Shape of each HF tensor for a moejax array of `moejax_shape`."""
    shape = tuple(moejax_shape[1:] if self.stacked else moejax_shape)
    return shape[::-1] if self.transpose else shape


def _projections(path, prefix, names, biases=()):
  out = []
  for ours, theirs in names.items():
    out.append(TensorMap((*path, ours, "kernel"), (f"{prefix}.{theirs}.weight",), True))
    if ours in biases:
      out.append(TensorMap((*path, ours, "bias"), (f"{prefix}.{theirs}.bias",)))
  return out


def _attention(m, i) -> list[TensorMap]:
  path, prefix, a = ("blocks", i, "attn"), f"model.layers.{i}.self_attn", m.attention
  if a.kind == "mla":
    unused = ("q",) if a.mla.q_lora_rank else ("q_a", "q_b")
    names = {k: v for k, v in MLA_NAMES.items() if k not in unused}
    biases = (("q_a", "kv_a") if a.qkv_bias else ()) + (("o",) if a.out_bias else ())
    out = _projections(path, prefix, names, biases)
    norms = {k: v for k, v in MLA_NORMS.items() if a.mla.q_lora_rank or k == "kv_a_norm"}
    return out + [
      TensorMap((*path, ours, "scale"), (f"{prefix}.{theirs}.weight",))
      for ours, theirs in norms.items()
    ]
  biases = (("q", "k", "v") if a.qkv_bias else ()) + (("o",) if a.out_bias else ())
  out = _projections(path, prefix, GQA_NAMES, biases)
  if a.qk_norm != "none":
    out += [
      TensorMap((*path, f"{t}_norm", "scale"), (f"{prefix}.{t}_norm.weight",)) for t in ("q", "k")
    ]
  return out


def _routed_ffn(m, i, num_experts) -> list[TensorMap]:
  family, path = m.family, ("blocks", i, "ffn")
  prefix = f"model.layers.{i}.{MOE_PREFIX.get(family, 'mlp')}"
  expert_names = EXPERT_NAMES.get(family, DEFAULT_EXPERT_NAMES)
  out = [TensorMap((*path, "router_kernel"), (f"{prefix}.gate.weight",), True)]
  out += [
    TensorMap(
      (*path, "experts", ours),
      tuple(f"{prefix}.experts.{e}.{theirs}.weight" for e in range(num_experts)),
      transpose=True,
      stacked=True,
    )
    for ours, theirs in expert_names.items()
  ]
  if m.moe.router == "group_limited":
    out.append(
      TensorMap(
        (*path, "router_state", "bias"),
        (f"{prefix}.gate.e_score_correction_bias",),
        collection="rest",
      )
    )
  if m.moe.shared.count:
    shared = SHARED_PREFIX.get(family, "shared_experts")
    out += _projections((*path, "shared"), f"{prefix}.{shared}", FFN_NAMES)
    if m.moe.shared.gate:
      out.append(TensorMap((*path, "shared_gate"), (f"{prefix}.shared_expert_gate.weight",), True))
  return out


def tensor_maps(m) -> list[TensorMap]:
  """Every parameter of the decoder `m` with its HF name(s), in checkpoint order."""
  out = [TensorMap(("embed",), ("model.embed_tokens.weight",))]
  counts = dict(zip(moe_layer_indices(m), expert_counts(m)))
  for i in range(m.num_layers):
    layer = f"model.layers.{i}"
    out.append(TensorMap(("blocks", i, "attn_norm", "scale"), (f"{layer}.input_layernorm.weight",)))
    out += _attention(m, i)
    out.append(
      TensorMap(("blocks", i, "ffn_norm", "scale"), (f"{layer}.post_attention_layernorm.weight",))
    )
    if i in counts:
      out += _routed_ffn(m, i, counts[i])
    else:
      out += _projections(("blocks", i, "ffn"), f"{layer}.mlp", FFN_NAMES)
  out.append(TensorMap(("final_norm", "scale"), ("model.norm.weight",)))
  if not m.tie_embeddings:
    out.append(TensorMap(("head", "kernel"), ("lm_head.weight",), True))
  return out
