"""The generation benchmark's first-divergence report (moejax/profiling/generation.py):
the earliest differing step, then row, and each model's logits there read on the
prompt plus the shared tokens, with stand-in models whose logits are known."""

import numpy as np
import pytest

from moejax.profiling.generation import first_divergence
from moejax.profiling.report import speed_table

VOCAB = 7


def logits_of(context, shift):
  """[V] logits that depend on the context's length and last token (and a shift)."""
  return np.arange(VOCAB, dtype=np.float32) * 0.1 + len(context) + context[-1] + shift


class FakeTorchOut:
  def __init__(self, logits):
    self.logits = logits


class FakeHF:
  def __call__(self, ids):
    import torch

    seen = ids.numpy()[0]
    return FakeTorchOut(torch.as_tensor(logits_of(seen, 0.5))[None, None].repeat(1, len(seen), 1))


class FakeLoaded:
  def __init__(self):
    self.contexts = []

  def model(self):
    def forward(ids):
      seen = np.asarray(ids)[0]
      self.contexts.append(seen.tolist())
      return np.tile(logits_of(seen, 0.0), (1, len(seen), 1)), {}, None

    return forward


def test_the_earliest_step_then_row_and_both_models_logits_there():
  pytest.importorskip("torch")
  prompts = np.array([[1, 2], [3, 4], [5, 6]])
  ours = np.array([[0, 1, 2, 3], [0, 1, 5, 3], [0, 6, 2, 3]])
  theirs = np.array([[0, 1, 2, 4], [0, 1, 2, 3], [0, 1, 2, 3]])
  loaded = FakeLoaded()
  d = first_divergence((FakeHF(), loaded), prompts, ours, theirs)
  # row 2 differs at step 1 (row 1 only at step 2, row 0 at step 3): the earliest step wins
  assert (d["row"], d["step"]) == (2, 1)
  assert d["tokens"] == {"moejax": 6, "transformers": 1}
  assert loaded.contexts == [[5, 6, 0]]  # the prompt and the one shared token
  context = np.array([5, 6, 0])
  for side, shift in (("moejax_logits", 0.0), ("transformers_logits", 0.5)):
    want = logits_of(context, shift)
    assert d[side] == pytest.approx({"moejax": want[6], "transformers": want[1]})
  row = {
    "family": "f",
    "batch": 3,
    "identical": 0.75,
    "first_divergence": d,
    **{f"{s}_{k}": 1.0 for s in ("ours", "theirs") for k in ("prefill_tok_s", "decode_tok_s")},
    **{f"{s}_ttft_s": 1.0 for s in ("ours", "theirs")},
    "prefill_ratio": 1.0,
    "decode_ratio": 1.0,
  }
  assert "first divergence at row 2, step 1: moejax picks 6, transformers 1" in speed_table([row])


def test_agreeing_generations_report_none():
  tokens = np.array([[1, 2, 3]])
  assert first_divergence((None, None), np.array([[0]]), tokens, tokens.copy()) is None
