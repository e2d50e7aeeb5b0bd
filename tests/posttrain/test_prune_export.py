"""A pruned model exports as an HF checkpoint that transformers loads with
moejax's logits (1e-4): the tiny default LM as Mixtral (experts removed, or
atoms removed), and an imported tiny DeepSeek-V3; unequal counts per layer are
refused by name."""

import numpy as np
import pytest
import transformers

from moejax.errors import ConfigError
from moejax.interop.convert import Loaded, export_hf, import_hf
from moejax.posttrain import prune
from tests.helpers import host
from tests.interop.hf_tiny import make_model, save_model
from tests.interop.export_checks import assert_export_matches

WINDOWS = np.random.default_rng(0).integers(0, 256, size=(8, 16)).astype(np.int32)


def test_pruned_default_lm_exports_as_mixtral(tiny_model, tmp_path):
  config, _, state = tiny_model
  m, params, rest, layers = prune.prune_model(
    config.model, host(state.params), host(state.rest), WINDOWS, keep="4", method="schur_astar"
  )
  assert m.moe.num_experts == 4 and [len(layer["kept"]) for layer in layers] == [4, 4]
  out = str(tmp_path / "hf")
  export_hf(m, params, rest, out, family="mixtral")
  assert transformers.AutoConfig.from_pretrained(out).num_local_experts == 4
  assert_export_matches(Loaded(m, params, rest), out)


def test_atom_pruned_default_lm_exports_as_mixtral_at_the_widest_kept_expert(tiny_model, tmp_path):
  """HEAPr keeps a different number of atoms per expert: the export is as wide as
  the widest kept expert, the others zero padded (atoms.remove_atoms)."""
  config, _, state = tiny_model
  m, params, rest, _ = prune.prune_model(
    config.model, host(state.params), host(state.rest), WINDOWS, keep="0.5", method="heapr"
  )
  assert m.moe.num_experts == config.model.moe.num_experts
  live = [
    np.any(block["ffn"]["experts"]["w_down"] != 0, axis=-1).sum(1)
    for block in params["blocks"].values()
  ]
  assert np.concatenate(live).min() < m.moe.expert_d_ff  # some experts are zero padded
  out = str(tmp_path / "hf")
  export_hf(m, params, rest, out, family="mixtral")
  assert transformers.AutoConfig.from_pretrained(out).intermediate_size == m.moe.expert_d_ff
  assert_export_matches(Loaded(m, params, rest), out)


def test_pruned_imported_deepseek_v3_exports_and_matches(tmp_path):
  # Two groups of four experts, both groups eligible: keeping 4 leaves two groups of two.
  hf_dir = save_model(
    make_model("deepseek_v3", vocab_size=256, n_group=2, topk_group=2), str(tmp_path / "source")
  )
  source = import_hf(hf_dir)
  m, params, rest, layers = prune.prune_model(
    source.config, source.params, source.rest, WINDOWS, keep="0.5", method="greedy"
  )
  assert m.moe.num_experts == 4
  out = str(tmp_path / "hf")
  export_hf(m, params, rest, out, base_hf_config=source.hf_config)
  assert transformers.AutoConfig.from_pretrained(out).n_routed_experts == 4
  assert_export_matches(Loaded(m, params, rest), out)


def test_unequal_counts_are_refused_at_export(tiny_model, tmp_path):
  config, _, state = tiny_model
  from moejax.posttrain import surgery

  m, params, rest = surgery.remove_experts(
    config.model, host(state.params), host(state.rest), {0: [0, 1, 2, 3], 1: [0, 1, 2]}
  )
  with pytest.raises(ConfigError, match=r"\[4, 3\] per MoE layer"):
    export_hf(m, params, rest, str(tmp_path / "hf"), family="mixtral")
