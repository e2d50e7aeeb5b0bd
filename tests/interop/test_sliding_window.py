"""Sliding windows are read and written the way transformers reads them (issue 11).

Qwen2-MoE without `layer_types` derives them in `Qwen2MoeConfig.__post_init__`
(layer i slides when use_sliding_window, i is even and i < max_window_layers);
Qwen3-MoE and Mixtral window every layer or none and ignore `layer_types`,
`max_window_layers` (and Mixtral `use_sliding_window`); OLMoE and DeepSeek-V3
masks never slide. Checked on config dicts against transformers' own config
objects, and on logits against transformers' models on sequences longer than
the window; the Qwen2-MoE export round-trips through transformers.
"""

import json
import os

import numpy as np
import pytest
import torch
import transformers

from moejax.errors import ConfigError
from moejax.interop.convert import export_hf, import_hf
from moejax.interop.hf_config import from_hf_config
from moejax.interop.parity import hf_forward, moejax_forward, padded_batch
from tests.interop.hf_tiny import family_configs, randomize_

NUM_LAYERS = 4
WINDOW_KEYS = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types")
SLIDE, FULL = "sliding_attention", "full_attention"


def config_json(family: str, **keys) -> dict:
  """A 4-layer config.json of `family` with exactly the given window keys."""
  hf = family_configs()[family].to_dict()
  for key in WINDOW_KEYS:
    hf.pop(key, None)
  hf.update(num_hidden_layers=NUM_LAYERS, mlp_only_layers=[], **keys)
  return hf


def transformers_windows(hf: dict) -> list[int]:
  """The window each layer of transformers' model uses (0 = full causal), read from
  transformers' config object the way each family's modeling file reads it."""
  config = transformers.AutoConfig.for_model(**hf)
  if hf["model_type"] == "qwen2_moe":  # per layer: layer_types + config.sliding_window
    return [config.sliding_window if kind == SLIDE else 0 for kind in config.layer_types]
  if hf["model_type"] in ("qwen3_moe", "mixtral"):  # config.sliding_window on every layer
    return [config.sliding_window or 0] * config.num_hidden_layers
  return [0] * config.num_hidden_layers  # olmoe, deepseek_v3: plain causal masks


CASES = {
  "qwen2_max_window_layers_2": (
    "qwen2_moe",
    dict(use_sliding_window=True, sliding_window=3, max_window_layers=2),
  ),
  "qwen2_max_window_layers_4": (
    "qwen2_moe",
    dict(use_sliding_window=True, sliding_window=3, max_window_layers=4),
  ),
  "qwen2_default_max_window_layers": ("qwen2_moe", dict(use_sliding_window=True, sliding_window=3)),
  "qwen2_use_sliding_window_absent": ("qwen2_moe", dict(sliding_window=3, max_window_layers=4)),
  "qwen2_use_sliding_window_false": (
    "qwen2_moe",
    dict(use_sliding_window=False, sliding_window=3, max_window_layers=4),
  ),
  "qwen2_default_window": ("qwen2_moe", dict(use_sliding_window=True, max_window_layers=4)),
  "qwen2_explicit_layer_types": (
    "qwen2_moe",
    dict(
      use_sliding_window=True,
      sliding_window=3,
      max_window_layers=1,
      layer_types=[FULL, SLIDE, SLIDE, FULL],
    ),
  ),
  "qwen3_all_layers": (
    "qwen3_moe",
    dict(use_sliding_window=True, sliding_window=3, max_window_layers=2, layer_types=[FULL] * 4),
  ),
  "qwen3_use_sliding_window_absent": ("qwen3_moe", dict(sliding_window=3)),
  "qwen3_use_sliding_window_false": ("qwen3_moe", dict(use_sliding_window=False, sliding_window=3)),
  "mixtral_ignores_use_sliding_window": (
    "mixtral",
    dict(sliding_window=3, use_sliding_window=False, max_window_layers=1, layer_types=[FULL] * 4),
  ),
  "mixtral_no_window": ("mixtral", dict()),
  "olmoe_never_slides": ("olmoe", dict(sliding_window=3, use_sliding_window=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_windows_equal_transformers_per_layer(case):
  family, keys = CASES[case]
  hf = config_json(family, **keys)
  want = transformers_windows(hf)
  assert from_hf_config(hf).attention.windows == want, (case, want)


def test_qwen2_sliding_layers_without_a_window_are_refused():
  # transformers sets sliding_window = 0 (use_sliding_window false) or keeps None and
  # then cannot build the sliding mask: refuse instead of guessing.
  for keys in (
    dict(use_sliding_window=False, layer_types=[SLIDE, FULL, FULL, FULL]),
    dict(use_sliding_window=True, sliding_window=None, max_window_layers=2),
  ):
    with pytest.raises(ConfigError, match="sliding_window"):
      from_hf_config(config_json("qwen2_moe", **keys))


def save_tiny(family: str, directory: str, drop_layer_types: bool, **keys):
  """A random transformers model of config_json(family, **keys), saved; config.json
  rewritten to hold the window keys as given (save_pretrained spells out layer_types)."""
  hf = config_json(family, **keys)
  config = transformers.AutoConfig.for_model(**hf)
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
  randomize_(model, 0)
  model.eval().save_pretrained(directory)
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    saved = json.load(f)
  saved.update(keys)
  if drop_layer_types:
    saved.pop("layer_types", None)
  with open(path, "w") as f:
    json.dump(saved, f)
  return model


def max_logit_diff(hf_model, loaded):
  tokens, mask, positions = padded_batch()  # 10 slots, window 3
  hf_logits, _ = hf_forward(hf_model, tokens, mask, positions)
  loaded.config.moe.grouped_matmul = "tiled"
  logits, _ = moejax_forward(loaded, tokens, mask)
  real = mask.astype(bool)
  assert np.abs(hf_logits[real]).max() > 0.5
  return float(np.abs(logits - hf_logits)[real].max()), hf_logits


def test_qwen2_max_window_layers_logits_and_export_round_trip(tmp_path):
  """Released Qwen2-MoE configs carry max_window_layers and no layer_types."""
  src, out = str(tmp_path / "src"), str(tmp_path / "out")
  save_tiny(
    "qwen2_moe",
    src,
    drop_layer_types=True,
    use_sliding_window=True,
    sliding_window=3,
    max_window_layers=2,
  )
  with open(os.path.join(src, "config.json")) as f:
    assert "layer_types" not in json.load(f)
  model = transformers.AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager")
  assert model.config.layer_types == [SLIDE, FULL, FULL, FULL]
  loaded = import_hf(src)
  diff, hf_logits = max_logit_diff(model, loaded)
  print(f"qwen2_moe max_window_layers=2: max |logit diff| = {diff:.2e}")
  assert diff <= 1e-4
  assert loaded.config.attention.windows == [3, 0, 0, 0]

  hf = export_hf(loaded.config, loaded.params, loaded.rest, out, base_hf_config=loaded.hf_config)
  assert hf["layer_types"] == [SLIDE, FULL, FULL, FULL] and hf["sliding_window"] == 3
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["layer_types"] == [SLIDE, FULL, FULL, FULL]
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
  assert reloaded.config.layer_types == [SLIDE, FULL, FULL, FULL]
  assert reloaded.config.sliding_window == 3
  tokens, mask, positions = padded_batch()
  again, _ = hf_forward(reloaded, tokens, mask, positions)
  real = mask.astype(bool)
  assert np.abs(again - hf_logits)[real].max() <= 1e-5
  assert import_hf(out).config.attention.windows == [3, 0, 0, 0]


@pytest.mark.parametrize("case", ["qwen3_all_layers", "mixtral_ignores_use_sliding_window"])
def test_every_layer_windowed_logits_equal_transformers(case, tmp_path):
  family, keys = CASES[case]
  model = save_tiny(family, str(tmp_path), drop_layer_types=False, **keys)
  loaded = import_hf(str(tmp_path))
  diff, _ = max_logit_diff(model, loaded)
  print(f"{case}: max |logit diff| = {diff:.2e}")
  assert diff <= 1e-4
  assert loaded.config.attention.windows == [3] * NUM_LAYERS
