"""Checks on an HF export shared by the interop, training and post-training tests:
its tensors read back (`read_all`) and transformers' logits on it (`assert_export_matches`)."""

import numpy as np

from moejax.interop.parity import export_logit_difference
from moejax.interop.safetensors_io import SafetensorsReader


def read_all(directory):
  """{tensor name: float32 array} of every tensor of the safetensors checkpoint in `directory`."""
  reader = SafetensorsReader(directory)
  return {name: reader.read(name, reader.shape(name), np.float32) for name in reader.names()}


def assert_export_matches(loaded, hf_dir: str, atol: float = 1e-4) -> None:
  """transformers loads the export in hf_dir with `loaded`'s logits on the
  padded batch (real tokens, float32)."""
  diff, scale = export_logit_difference(loaded, hf_dir)
  assert scale > 0.5, scale  # not a comparison between near-zero logits
  assert diff <= atol, diff
