"""moejax's defaults for config.json keys equal transformers' own.

Released configs leave keys out (DeepSeek-V3's have no `rope_interleave`), and
transformers fills them with its defaults. For every family and every key of its
tiny config.json, the key is dropped, the file loaded by transformers (which
resolves every default into its config object) and by moejax; moejax must read
the dropped file exactly as it reads transformers' resolved one. That resolved
file has every key explicit, and explicit keys are what test_parity.py checks
against transformers' logits (1e-4), so equal readings mean equal logits. A key
moejax cannot do without must be refused, naming it (released configs always
have those). Where transformers' default is one moejax refuses (e.g. 8 kv heads
for a 4-head model) both must refuse.
"""

import json
import os

import pytest

from moejax.migrate import flatten_config
from moejax.errors import ConfigError
from moejax.interop.hf_config import from_hf_config
from tests.interop.hf_tiny import FAMILY_NAMES, family_configs

# Keys moejax needs (it refuses the file without them, naming the key); released
# configs always have them. Bookkeeping keys transformers itself rewrites are skipped.
REQUIRED = {
  "vocab_size",
  "hidden_size",
  "num_hidden_layers",
  "num_attention_heads",
  "num_experts_per_tok",
  "num_local_experts",
  "num_experts",
  "n_routed_experts",
  "intermediate_size",
  "kv_lora_rank",
  "qk_nope_head_dim",
  "qk_rope_head_dim",
  "v_head_dim",
}
SKIPPED = {"model_type", "transformers_version", "architectures"}


def saved_config(family, **overrides) -> dict:
  """The family's tiny config with every attribute written (not only non-defaults)."""
  config = family_configs()[family]
  for key, value in overrides.items():
    setattr(config, key, value)
  return json.loads(config.to_json_string(use_diff=False))


def transformers_resolved(hf: dict, directory) -> dict:
  """config.json `hf` as transformers reads it, with its defaults filled in."""
  import transformers

  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf, f)
  return transformers.AutoConfig.from_pretrained(directory).to_dict()


def moejax_reading(hf: dict) -> dict:
  return flatten_config(from_hf_config(hf).to_dict())


def moejax_or_error(hf: dict):
  """moejax's reading of `hf`, or the ConfigError it refuses it with."""
  try:
    return moejax_reading(hf)
  except ConfigError as e:
    return e


def check_key(hf: dict, key: str, tmp_path):
  """moejax reads `hf` without `key` as it reads transformers' resolved config."""
  dropped = {k: v for k, v in hf.items() if k != key}
  ours = moejax_or_error(dropped)
  if key in REQUIRED and isinstance(ours, ConfigError):
    assert key in str(ours)  # refused, naming the key
    return
  theirs = moejax_or_error(transformers_resolved(dropped, tmp_path / "resolved"))
  if isinstance(theirs, ConfigError):  # transformers' default is one moejax refuses outright
    assert isinstance(ours, ConfigError), (key, ours, theirs)
    return
  assert not isinstance(ours, ConfigError), f"without {key!r}: {ours}"
  diff = {
    k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)
  }
  assert not diff, f"without {key!r}: moejax default != transformers default: {diff}"


def family_keys():
  return [
    (family, key) for family in FAMILY_NAMES for key in sorted(set(saved_config(family)) - SKIPPED)
  ]


def test_the_untouched_config_reads_the_same_either_way(tmp_path):
  for family in FAMILY_NAMES:
    hf = saved_config(family)
    assert moejax_reading(transformers_resolved(hf, tmp_path / family)) == moejax_reading(hf)


@pytest.mark.parametrize("family,key", family_keys())
def test_a_dropped_key_reads_as_transformers_default(family, key, tmp_path):
  check_key(saved_config(family), key, tmp_path)


@pytest.mark.parametrize(
  "key", ["layer_types", "max_window_layers", "sliding_window", "use_sliding_window"]
)
def test_qwen2_moe_sliding_window_defaults(key, tmp_path):
  # released Qwen2-MoE configs: use_sliding_window with max_window_layers, no layer_types
  # (issue 11, correctness bug 1: these failed before 1b5c4da)
  hf = saved_config("qwen2_moe", use_sliding_window=True, sliding_window=4, max_window_layers=1)
  hf.pop("layer_types", None)
  check_key(hf, key, tmp_path)


def test_hf_shared_expert_fields_map_to_the_shared_section():
  """Qwen2-MoE's shared_expert_intermediate_size (one sigmoid-gated shared expert) and
  DeepSeek-V3's n_shared_experts (plain, of the routed width) are model.moe.shared."""
  qwen = from_hf_config(saved_config("qwen2_moe", shared_expert_intermediate_size=40)).moe
  assert qwen.shared.to_dict() == {"count": 1, "d_ff": 40, "gate": True}
  deepseek = from_hf_config(saved_config("deepseek_v3", n_shared_experts=2)).moe
  assert deepseek.shared.to_dict() == {"count": 2, "d_ff": deepseek.expert_d_ff, "gate": False}
  assert from_hf_config(saved_config("mixtral")).moe.shared.count == 0


def test_a_converted_workdir_saved_with_flat_shared_keys_reads_the_same_model():
  from moejax.migrate import model_config_from_dict

  m = from_hf_config(saved_config("qwen2_moe", shared_expert_intermediate_size=40))
  stored = m.to_dict()
  shared = stored["moe"].pop("shared")
  stored["moe"].update(
    num_shared_experts=shared["count"],
    shared_d_ff=shared["d_ff"],
    shared_expert_gate=shared["gate"],
  )
  assert model_config_from_dict(stored).to_dict() == m.to_dict()


def test_hf_routing_fields_map_to_the_routing_section():
  """norm_topk_prob, and DeepSeek-V3's n_group, topk_group and routed_scaling_factor,
  are model.moe.routing; an imported model's aux-loss-free bias stays as trained."""
  qwen = from_hf_config(saved_config("qwen3_moe", norm_topk_prob=False)).moe.routing
  assert qwen.renormalize is False and qwen.bias_update_rate == 0.0
  deepseek = from_hf_config(
    saved_config("deepseek_v3", n_group=2, topk_group=1, routed_scaling_factor=2.5)
  ).moe.routing
  assert (deepseek.num_groups, deepseek.topk_groups, deepseek.routed_scaling_factor) == (2, 1, 2.5)


def test_a_converted_workdir_saved_with_flat_routing_keys_reads_the_same_model():
  from moejax.migrate import model_config_from_dict
  from moejax.routing import ROUTING

  m = from_hf_config(saved_config("deepseek_v3", n_group=2, topk_group=1))
  stored = m.to_dict()
  routing = stored["moe"].pop("routing")
  stored["moe"].update({old: routing[key] for old, key in ROUTING.legacy_keys})
  assert model_config_from_dict(stored).to_dict() == m.to_dict()
