"""Which layers are sparse, their windows and expert counts: the layer structure of a
`model` config section, read by the decoder, the trainer and every tool (no
validation here: moejax/validation.py)."""

import ml_collections


def moe_layer_indices(m) -> list[int]:
  """Sparse layers: i >= moe.first_dense with (i - first_dense) % every_n == 0 and i
  not in moe.dense_layers (none when model.ffn_type is 'dense')."""
  e = m.moe
  if m.ffn_type != "moe":
    return []
  return [
    i
    for i in range(m.num_layers)
    if i >= e.first_dense and i not in e.dense_layers and (i - e.first_dense) % e.every_n == 0
  ]


def set_moe_layers(m, layers) -> None:
  """Make exactly `layers` sparse (ffn_type 'dense' when none): an HF config's
  list expressed in moe.first_dense / every_n / dense_layers. Works on a
  ConfigDict or a plain dict."""
  layers = sorted(layers)
  if not layers:
    m["ffn_type"] = "dense"
    return
  if m["ffn_type"] == "dense":
    m["ffn_type"] = "moe"
  first = layers[0]
  m["moe"]["first_dense"], m["moe"]["every_n"] = first, 1
  m["moe"]["dense_layers"] = [i for i in range(first, m["num_layers"]) if i not in layers]


def layer_windows(m) -> list[int]:
  """The sliding window of every layer (0 = full causal)."""
  return list(m.attention.windows) or [0] * m.num_layers


def layer_moe_config(m, moe_index: int) -> ml_collections.FrozenConfigDict:
  """The MoE section of the moe_index-th MoE layer, with its own expert count (pruned)."""
  moe = ml_collections.ConfigDict(m.moe.to_dict())
  if m.moe.expert_counts:
    moe.num_experts = m.moe.expert_counts[moe_index]
  return ml_collections.FrozenConfigDict(moe)


def expert_counts(m) -> list[int]:
  """Experts per MoE layer."""
  return list(m.moe.expert_counts) or [m.moe.num_experts] * len(moe_layer_indices(m))
