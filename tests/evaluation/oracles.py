"""The Decoder's log-probabilities of documents, computed directly for oracles."""

import jax
import numpy as np
from flax import nnx


def direct_logprobs(model, texts: list[str]) -> tuple[list[np.ndarray], dict]:
  """Per text, float64 log p of each byte after the separator byte 0, from one
  jitted forward pass over a right-padded batch (a causal model's logits of a
  prefix ignore what follows it); and that pass's aux."""
  seqs = [np.frombuffer(b"\0" + t.encode(), np.uint8).astype(np.int32) for t in texts]
  batch = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
  for i, seq in enumerate(seqs):
    batch[i, : len(seq)] = seq
  logits, aux = nnx.jit(lambda m, x: m(x)[:2])(model, batch)
  logp = np.asarray(jax.nn.log_softmax(logits, -1), np.float64)
  return [logp[i, np.arange(len(s) - 1), s[1:]] for i, s in enumerate(seqs)], aux
