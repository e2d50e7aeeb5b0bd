"""HF config.json <-> the model config (moejax/config.py `model`, one schema for all).

`from_hf_config` reads a family's config.json (transformers 4.x and 5.x key
spellings: `rope_theta`/`rope_scaling` or `rope_parameters`, every alias of
the expert count) into the decoder's flags and sizes. `to_hf_config` writes
them back over the original config.json when there is one, so keys moejax
does not use (token ids, generation settings) survive a round trip.
`check_expressible` refuses an export the family cannot represent (e.g. a
moejax LM with shared experts written as Mixtral), naming the keys.
"""

import ml_collections

from moejax.config import base_config
from moejax.models.structure import expert_counts, layer_windows, moe_layer_indices, set_moe_layers
from moejax.migrate import flatten_config
from moejax.validation import validate_model
from moejax.errors import ConfigError
from moejax.models.families import FAMILIES, FAMILY_DEFAULTS

_REQUIRED = object()
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
ROPE_KEYS = {
  "factor": "factor",
  "original_max_position": "original_max_position_embeddings",
  "beta_fast": "beta_fast",
  "beta_slow": "beta_slow",
  "mscale": "mscale",
  "mscale_all_dim": "mscale_all_dim",
  "attention_factor": "attention_factor",
  "truncate": "truncate",
}


def supported_architectures() -> str:
  return ", ".join(f"{f.architecture} ({name})" for name, f in sorted(FAMILIES.items()))


def family_of(hf: dict):
  model_type = hf.get("model_type")
  if model_type not in FAMILIES:
    arch = (hf.get("architectures") or [model_type])[0]
    raise ConfigError(
      f"unsupported architecture {arch!r} (model_type={model_type!r}); "
      f"supported: {supported_architectures()}"
    )
  return FAMILIES[model_type]


def _get(hf: dict, *keys, default=_REQUIRED):
  for key in keys:
    if hf.get(key) is not None:
      return hf[key]
  if default is _REQUIRED:
    raise ConfigError(f"config.json ({hf.get('model_type')}) has no {' / '.join(keys)}")
  return default


def _read_rope(hf: dict, rope) -> None:
  params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  rope.theta = float(_get(params, "rope_theta", default=_get(hf, "rope_theta", default=10000.0)))
  kind = params.get("rope_type", params.get("type", "default"))
  if kind not in ("default", "yarn"):
    raise ConfigError(f"config.json rope type {kind!r} is not supported; supported: default, yarn")
  rope.scaling = kind
  for ours, theirs in ROPE_KEYS.items():
    if params.get(theirs) is not None:
      rope[ours] = type(rope[ours])(params[theirs])


def _windows(hf: dict, family, num_layers: int) -> list[int]:
  """Per-layer sliding windows (0 = full causal) as transformers 5.x derives them
  (checked against 5.24: each family's configuration_*.py and modeling_*.py).

  qwen2_moe: `sliding_window` (default 4096) when `use_sliding_window` (default
    False), else 0, on the layers whose `layer_types` entry is
    "sliding_attention"; without `layer_types` (released configs), layer i slides
    iff use_sliding_window and i is even and i < `max_window_layers` (default 28),
    as Qwen2MoeConfig.__post_init__ derives it.
  qwen3_moe: `sliding_window` (default 4096) on every layer when
    `use_sliding_window` (default False); layer_types/max_window_layers unused.
  mixtral: `sliding_window` (default None) on every layer; use_sliding_window,
    layer_types and max_window_layers unused.
  olmoe, deepseek_v3: no window (their masks are plain causal).
  """
  kind = family.model_type
  if kind == "qwen2_moe":
    use = bool(hf.get("use_sliding_window", False))
    types = hf.get("layer_types") or [
      "sliding_attention"
      if use and (i + 1) % 2 and i < hf.get("max_window_layers", 28)
      else "full_attention"
      for i in range(num_layers)
    ]
    window = hf.get("sliding_window", 4096) if use else 0
    if "sliding_attention" in types and not window:
      raise ConfigError(
        f"config.json (qwen2_moe) has sliding layers (layer_types={types}) but "
        f"no window (use_sliding_window={hf.get('use_sliding_window')}, "
        f"sliding_window={hf.get('sliding_window')}): transformers cannot run "
        "it either; set use_sliding_window=true and sliding_window > 0"
      )
    return [window if t == "sliding_attention" else 0 for t in types]
  if kind == "qwen3_moe":
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window", False) else None
  elif kind == "mixtral":
    window = hf.get("sliding_window")
  else:
    window = None
  if window is not None and window <= 0:
    raise ConfigError(f"config.json ({kind}) sliding_window={window} must be > 0 or null")
  return [window or 0] * num_layers


def _moe_layers(hf: dict, family, num_layers: int) -> list[int]:
  if family.model_type == "deepseek_v3":
    return list(range(hf.get("first_k_dense_replace", 0), num_layers))
  if family.model_type in ("qwen2_moe", "qwen3_moe"):
    step, dense = hf.get("decoder_sparse_step", 1), set(hf.get("mlp_only_layers") or [])
    return [i for i in range(num_layers) if i not in dense and (i + 1) % step == 0]
  return list(range(num_layers))


def imported_model_config() -> ml_collections.ConfigDict:
  """The schema's defaults with what an imported model starts from: no router
  losses and a frozen aux-loss-free bias (a fine-tuning config sets its own)."""
  m = base_config().model
  m.moe.loss_weights = {}
  m.moe.routing.bias_update_rate = 0.0  # a loaded model's bias stays as trained
  return m


def from_hf_config(hf: dict) -> ml_collections.ConfigDict:
  """The model config of a supported family's config.json (ConfigError otherwise)."""
  family = family_of(hf)
  hf = {**FAMILY_DEFAULTS.get(family.model_type, {}), **hf}
  if _get(hf, "hidden_act", default="silu") != "silu":
    raise ConfigError(
      f"config.json hidden_act={hf['hidden_act']!r}: only silu (SwiGLU) experts are supported"
    )
  m = imported_model_config()
  m.family = family.model_type
  m.vocab_size, m.d_model = _get(hf, "vocab_size"), _get(hf, "hidden_size")
  m.num_layers, m.num_heads = _get(hf, "num_hidden_layers"), _get(hf, "num_attention_heads")
  m.num_kv_heads = _get(hf, "num_key_value_heads", default=m.num_heads)
  m.head_dim = _get(hf, "head_dim", default=m.d_model // m.num_heads)
  m.norm_eps = float(_get(hf, "rms_norm_eps", default=1e-6))
  m.tie_embeddings = bool(hf.get("tie_word_embeddings", False))
  m.max_seq_len = _get(hf, "max_position_embeddings", default=4096)
  _read_rope(hf, m.rope)
  a = m.attention
  a.kind, a.qk_norm = family.attention, family.qk_norm
  if family.model_type == "qwen2_moe":
    a.qkv_bias = bool(hf.get("qkv_bias", True))
  else:
    a.qkv_bias = a.out_bias = bool(hf.get("attention_bias", False))
  a.clip_qkv = float(hf.get("clip_qkv") or 0.0)
  a.windows = _windows(hf, family, m.num_layers)

  e = m.moe
  e.router, e.num_experts = family.router, _get(hf, *EXPERT_COUNT_KEYS)
  e.top_k = _get(hf, "num_experts_per_tok")
  e.routing.renormalize = family.always_renormalize or bool(
    hf.get("norm_topk_prob", family.model_type == "deepseek_v3")
  )
  e.expert_d_ff = _get(hf, "moe_intermediate_size", "intermediate_size")
  m.d_ff = _get(hf, "intermediate_size")
  set_moe_layers(m, _moe_layers(hf, family, m.num_layers))
  if family.model_type == "qwen2_moe" and _get(hf, "shared_expert_intermediate_size", default=0):
    e.shared.count, e.shared.d_ff = 1, hf["shared_expert_intermediate_size"]
    e.shared.gate = True
  if family.model_type == "deepseek_v3":
    if hf.get("scoring_func", "sigmoid") != "sigmoid":
      raise ConfigError(
        f"config.json scoring_func={hf['scoring_func']!r}: DeepseekV3 routing "
        "here scores experts with a sigmoid only"
      )
    e.shared.count, e.shared.d_ff = hf.get("n_shared_experts") or 0, e.expert_d_ff
    r = e.routing
    r.num_groups, r.topk_groups = hf.get("n_group") or 1, hf.get("topk_group") or 1
    r.routed_scaling_factor = float(hf.get("routed_scaling_factor", 1.0))
    mla = a.mla
    mla.q_lora_rank = hf.get("q_lora_rank") or 0
    mla.kv_lora_rank = _get(hf, "kv_lora_rank")
    mla.qk_nope_head_dim, mla.qk_rope_head_dim = (
      _get(hf, "qk_nope_head_dim"),
      _get(hf, "qk_rope_head_dim"),
    )
    mla.v_head_dim = _get(hf, "v_head_dim")
    m.rope.interleave = bool(hf.get("rope_interleave", True))
  validate_model(m)
  return m


def _family_keys(m, family) -> dict:
  """The config.json keys of `family` that carry m's values."""
  e, a = m.moe, m.attention
  counts = set(expert_counts(m))
  if len(counts) > 1:
    raise ConfigError(
      f"{family.architecture} holds one expert count for every layer; this "
      f"model has {expert_counts(m)} per MoE layer. Prune to the same count "
      "in every layer to export it."
    )
  num_experts = counts.pop() if counts else e.num_experts
  moe_layers = moe_layer_indices(m)
  dense_layers = [i for i in range(m.num_layers) if i not in moe_layers]
  windows = layer_windows(m)
  window = max(windows) if any(windows) else None
  out = {
    "architectures": [family.architecture],
    "model_type": family.model_type,
    "vocab_size": m.vocab_size,
    "hidden_size": m.d_model,
    "num_hidden_layers": m.num_layers,
    "num_attention_heads": m.num_heads,
    "num_key_value_heads": m.num_kv_heads,
    "head_dim": m.head_dim,
    "rms_norm_eps": m.norm_eps,
    "tie_word_embeddings": m.tie_embeddings,
    "max_position_embeddings": m.max_seq_len,
    "hidden_act": "silu",
    "num_experts_per_tok": e.top_k,
    "rope_parameters": _rope_parameters(m.rope),
  }
  kind = family.model_type
  if kind in ("mixtral", "olmoe"):
    out.update(intermediate_size=e.expert_d_ff)
  else:
    out.update(intermediate_size=m.d_ff, moe_intermediate_size=e.expert_d_ff)
  if kind != "mixtral":
    out["norm_topk_prob"] = e.routing.renormalize
  if kind == "mixtral":
    out.update(num_local_experts=num_experts, sliding_window=window)
  elif kind in ("qwen2_moe", "qwen3_moe"):
    out.update(
      num_experts=num_experts,
      decoder_sparse_step=1,
      mlp_only_layers=dense_layers,
      use_sliding_window=window is not None,
      sliding_window=window,
    )
    if kind == "qwen2_moe":
      out.update(
        qkv_bias=a.qkv_bias,
        shared_expert_intermediate_size=(e.shared.count * e.shared.d_ff),
        layer_types=["sliding_attention" if w else "full_attention" for w in windows],
      )
    else:
      out["attention_bias"] = a.qkv_bias
  elif kind == "olmoe":
    out.update(num_experts=num_experts, attention_bias=a.qkv_bias, clip_qkv=a.clip_qkv or None)
  elif kind == "deepseek_v3":
    mla = a.mla
    out.update(
      n_routed_experts=num_experts,
      n_shared_experts=e.shared.count,
      first_k_dense_replace=min(moe_layers, default=m.num_layers),
      n_group=e.routing.num_groups,
      topk_group=e.routing.topk_groups,
      routed_scaling_factor=e.routing.routed_scaling_factor,
      q_lora_rank=mla.q_lora_rank or None,
      kv_lora_rank=mla.kv_lora_rank,
      qk_nope_head_dim=mla.qk_nope_head_dim,
      qk_rope_head_dim=mla.qk_rope_head_dim,
      v_head_dim=mla.v_head_dim,
      head_dim=mla.qk_rope_head_dim,
      rope_interleave=m.rope.interleave,
      attention_bias=a.qkv_bias,
    )
  return out


def _rope_parameters(rope) -> dict:
  out = {"rope_type": rope.scaling, "rope_theta": rope.theta}
  if rope.scaling == "yarn":
    out.update(
      {
        theirs: rope[ours]
        for ours, theirs in ROPE_KEYS.items()
        if rope[ours] or theirs == "truncate"
      }
    )
  return out


def to_hf_config(m, family: str | None = None, base: dict | None = None) -> dict:
  """config.json for `m` as `family` (default m.family), over `base` (the original)."""
  target = FAMILIES.get(family or m.family)
  if target is None:
    raise ConfigError(
      f"export family {family or m.family!r} is not supported; supported: "
      f"{supported_architectures()}"
    )
  out = {
    k: v
    for k, v in (base or {}).items()
    if k not in ("rope_theta", "rope_scaling", "torch_dtype") + EXPERT_COUNT_KEYS
  }
  out.update(_family_keys(m, target))
  check_expressible(m, out)
  return out


# The MoE keys that change what a loaded model computes (the rest are training,
# dispatch or other routers' settings).
COMPUTE_MOE_KEYS = (
  "router",
  "experts",
  "top_k",
  "routing.renormalize",
  "routing.routed_scaling_factor",
  "expert_d_ff",
  "shared.count",
  "shared.d_ff",
  "shared.gate",
  "routing.num_groups",
  "routing.topk_groups",
)
_FREE_KEYS = ("family", "dtype")


# Keys that say the same thing another way (compared as moe_layers and windows).
_LAYOUT_KEYS = (
  "ffn_type",
  "moe.first_dense",
  "moe.every_n",
  "moe.dense_layers",
  "attention.windows",
)


def _compute_keys(m) -> dict:
  flat = flatten_config(m.to_dict())
  out = {
    k: v
    for k, v in flat.items()
    if k not in _LAYOUT_KEYS
    and not k.startswith("l3.")
    and (not k.startswith("moe.") or k[len("moe.") :] in COMPUTE_MOE_KEYS)
  }
  out.update(
    moe_layers=tuple(moe_layer_indices(m)),
    windows=tuple(layer_windows(m)),
    l3=bool(m.get("l3") and m.l3.enabled),
  )
  return out


def check_expressible(m, hf: dict) -> None:
  """ConfigError unless reading `hf` back gives m's computation (listing the keys that differ)."""
  back = _compute_keys(from_hf_config(hf))
  ours = _compute_keys(m)
  if m.attention.kind != "mla":  # MLA sizes are unused by GQA models
    back = {k: v for k, v in back.items() if not k.startswith("attention.mla.")}
    ours = {k: v for k, v in ours.items() if not k.startswith("attention.mla.")}
  if m.moe.shared.count == 0:
    back.pop("moe.shared.d_ff", None)
    ours.pop("moe.shared.d_ff", None)
  if len(moe_layer_indices(m)) in (0, m.num_layers):
    back.pop("d_ff", None)
    ours.pop("d_ff", None)
  diffs = [
    f"{k}: model={ours.get(k)!r} {hf['model_type']}={back.get(k)!r}"
    for k in sorted(set(ours) | set(back))
    if not k.startswith(_FREE_KEYS) and ours.get(k) != back.get(k)
  ]
  if diffs:
    raise ConfigError(
      f"{hf['architectures'][0]} cannot express this model "
      f"({len(diffs)} difference(s)): " + "; ".join(diffs[:8])
    )
