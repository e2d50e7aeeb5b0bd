"""bpb over whole documents: uniform models, windowing against a direct loop, the Decoder."""

import math

import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.configs.lm_shakespeare_moe import get_config
from moejax.data.tokenizers import ByteTokenizer
from moejax.evaluation import bpb
from moejax.evaluation.model import DecoderLM, LogitsLM
from moejax.models.decoder import Decoder
from tests.evaluation.oracles import direct_logprobs

V = 256
TEXTS = [
  ("prose", "It was the best of times, it was the worst of times."),
  ("code", "def f(x):\n  return x * 2\n" * 3),
  ("prose", "Q"),
]


class PairTokenizer:
  """Two letters of 'a'..'p' per token (ids 16 i + j < 256): 2 bytes per token."""

  def encode(self, text):
    ids = [ord(c) - ord("a") for c in text]
    return np.array([16 * a + b for a, b in zip(ids[::2], ids[1::2])], np.int32)


def uniform(inputs):
  return np.zeros(inputs.shape + (V,))


def bigram_table(seed=0):
  return np.random.default_rng(seed).normal(size=(V, V)) * 3


def test_uniform_logits_give_log2_vocab_over_bytes_per_token():
  docs = bpb.encode_documents(TEXTS, ByteTokenizer())
  scores = bpb.score_documents(LogitsLM(uniform, V), docs, 0, context=16, stride=5)
  assert bpb.bpb_by_domain(docs, scores.nats) == pytest.approx(
    {"code": 8.0, "prose": 8.0, "all": 8.0}, rel=1e-13
  )
  docs = bpb.encode_documents([("x", "abcdefghijklmnop" * 5)], PairTokenizer())
  scores = bpb.score_documents(LogitsLM(uniform, V), docs, 0, context=8)
  assert bpb.bpb_by_domain(docs, scores.nats)["x"] == pytest.approx(math.log2(V) / 2, rel=1e-13)


def test_windows_by_hand():
  assert bpb.windows(10, 4, 2) == [(0, 4, 0), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
  assert bpb.windows(8, 4, 4) == [(0, 4, 0), (4, 8, 4)]
  assert bpb.windows(3, 4, 1) == [(0, 3, 0)]


@pytest.mark.parametrize("context,stride", [(1, 1), (4, 4), (4, 3), (7, 2), (64, 64)])
def test_every_token_scored_once_with_the_right_input(context, stride):
  table = bigram_table()
  lm = LogitsLM(lambda inputs: table[inputs], V)  # p(next | previous token)
  docs = bpb.encode_documents(TEXTS, ByteTokenizer())
  scores = bpb.score_documents(lm, docs, 0, context=context, stride=stride, batch_size=3)
  logp = table - np.log(np.exp(table).sum(1, keepdims=True))
  for d, doc in enumerate(docs):
    seq = np.concatenate([[0], doc.tokens])
    want = -sum(logp[seq[i], seq[i + 1]] for i in range(len(doc.tokens)))
    assert scores.nats[d] == pytest.approx(want, rel=1e-12)
    assert scores.num_tokens[d] == len(doc.tokens)
  nats = np.array([scores.nats[0] + scores.nats[2], scores.nats[1]])
  by_bytes = [docs[0].num_bytes + docs[2].num_bytes, docs[1].num_bytes]
  assert bpb.bpb_by_domain(docs, scores.nats) == pytest.approx(
    {
      "prose": nats[0] / math.log(2) / by_bytes[0],
      "code": nats[1] / math.log(2) / by_bytes[1],
      "all": nats.sum() / math.log(2) / sum(by_bytes),
    },
    rel=1e-12,
  )


def test_decoder_scores_match_a_direct_forward_pass():
  m = get_config("size=tiny").model
  model = Decoder(ml_collections.FrozenConfigDict(m), rngs=nnx.Rngs(0))
  _, params, rest = nnx.split(model, nnx.Param, ...)
  lm = DecoderLM(m, nnx.to_pure_dict(params), nnx.to_pure_dict(rest))
  docs = bpb.encode_documents([("a", "To be, or not"), ("b", "x = 1\n")], ByteTokenizer())
  scores = bpb.score_documents(lm, docs, 0, context=32, batch_size=4)  # padded batch
  logprobs, aux = direct_logprobs(model, ["To be, or not", "x = 1\n"])
  for d, (doc, logp) in enumerate(zip(docs, logprobs)):
    assert scores.nats[d] == pytest.approx(-logp.sum(), rel=2e-6)
    first = int(np.sum(scores.num_tokens[:d]))
    for layer, experts in zip(aux["moe"], scores.routing):  # [2 x 14 tokens, 2 slots]
      want = np.asarray(layer["expert_index"]).reshape(2, 14, -1)[d, : len(doc.tokens)]
      np.testing.assert_array_equal(experts[first : first + len(doc.tokens)], want)
  assert len(scores.routing) == 2 and scores.token_doc.tolist() == [0] * 13 + [1] * 6
