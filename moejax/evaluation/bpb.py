"""Bits per byte per domain over whole held-out documents.

Each document is scored on its own, as training sees it after a separator:
the model reads [prefix_id] + tokens and predicts every token of the
document (the prefix is the tokenizer's document separator, e.g. byte 0 for
the byte tokenizer). A document longer than the context is cut into windows
of `context` inputs that advance by `stride`; each target is scored exactly
once, in the first window that reaches it, so with stride < context every
target after the first window sees at least context - stride tokens. No
window crosses a document boundary.

bpb = total nats / ln 2 / total UTF-8 bytes of the documents' text, so it
does not depend on the tokenizer (the separator is neither scored nor
counted).
"""

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation.model import LM, Row, score_rows


@dataclasses.dataclass(frozen=True)
class Document:
  domain: str
  tokens: np.ndarray  # int32 [n]
  num_bytes: int  # UTF-8 bytes of its text


def encode_documents(items: Iterable[tuple[str, str | bytes]], tokenizer) -> list[Document]:
  """(domain, text) pairs as Documents; bytes are decoded as UTF-8 first."""
  docs = []
  for domain, text in items:
    text = text.decode("utf-8") if isinstance(text, bytes) else text
    docs.append(
      Document(domain, np.asarray(tokenizer.encode(text), np.int32), len(text.encode("utf-8")))
    )
  return docs


def domain_windows(documents, tokenizer, prefix_id: int, context: int) -> tuple[np.ndarray, dict]:
  """(int32 [N, context] windows, {domain: windows}): each domain's documents as one
  stream of [prefix_id] + tokens, cut into whole windows (the remainder left out)."""
  streams: dict[str, list] = {}
  for doc in encode_documents(documents, tokenizer):
    streams.setdefault(doc.domain, []).extend([[prefix_id], doc.tokens])
  windows, counts = [np.zeros((0, context), np.int32)], {}
  for domain, parts in streams.items():
    stream = np.concatenate(parts).astype(np.int32)
    n = len(stream) // context
    counts[domain] = n
    windows.append(stream[: n * context].reshape(n, context))
  return np.concatenate(windows), counts


def windows(num_targets: int, context: int, stride: int) -> list[tuple[int, int, int]]:
  """(begin, end, first_scored) per window over targets [0, num_targets):
  inputs begin..end-1 predict targets begin..end-1, scored from first_scored."""
  if not 1 <= stride <= context:
    raise ConfigError(f"stride={stride} must be in [1, context={context}]")
  out, begin, done = [], 0, 0
  while done < num_targets:
    end = min(begin + context, num_targets)
    out.append((begin, end, done))
    done, begin = end, begin + stride
  return out


def document_rows(tokens: np.ndarray, prefix_id: int, context: int, stride: int) -> list[Row]:
  """The rows that score every token of one document once (see module doc)."""
  seq = np.concatenate([[prefix_id], tokens]).astype(np.int32)
  rows = []
  for begin, end, first in windows(len(tokens), context, stride):
    score = np.arange(begin, end) >= first
    rows.append(Row(seq[begin:end], seq[begin + 1 : end + 1], score))
  return rows


@dataclasses.dataclass
class DocumentScores:
  nats: np.ndarray  # float64 [D]: -sum log p over each document's tokens
  num_tokens: np.ndarray  # int64 [D]
  routing: list  # per MoE layer int32 [N, S]: the experts of each scored token's input
  token_doc: np.ndarray  # int64 [N]: the document of each scored token


def score_documents(
  lm: LM,
  docs: list[Document],
  prefix_id: int,
  *,
  context: int,
  stride: int | None = None,
  batch_size: int = 8,
) -> DocumentScores:
  """Every token of every document scored once (module doc); float64 sums."""
  stride = context if stride is None else stride
  if context < 1:
    raise ConfigError(f"context={context} must be >= 1")
  rows, owner = [], []
  for d, doc in enumerate(docs):
    if len(doc.tokens) == 0:
      raise ConfigError(f"document {d} (domain {doc.domain!r}) encodes to no tokens")
    doc_rows = document_rows(doc.tokens, prefix_id, context, stride)
    rows += doc_rows
    owner += [d] * len(doc_rows)
  scored = score_rows(lm, rows, context, batch_size, pad_id=prefix_id)
  row_doc = np.asarray(owner, np.int64)
  nats = np.zeros(len(docs), np.float64)
  np.add.at(nats, row_doc, [-s.logprob.sum() for s in scored])
  counts = np.array([len(s.logprob) for s in scored], np.int64)
  num_tokens = np.bincount(row_doc, weights=counts, minlength=len(docs)).astype(np.int64)
  layers = len(scored[0].routing) if scored else 0
  routing = [np.concatenate([s.routing[j] for s in scored]) for j in range(layers)]
  return DocumentScores(nats, num_tokens, routing, np.repeat(row_doc, counts))


def bpb_by_domain(docs: list[Document], nats: np.ndarray) -> dict[str, float]:
  """{domain: bits per byte, ..., 'all': over every document}, domains sorted."""
  out = {}
  for domain in sorted({d.domain for d in docs}) + ["all"]:
    pick = [i for i, d in enumerate(docs) if domain in ("all", d.domain)]
    out[domain] = float(np.sum(nats[pick]) / math.log(2) / sum(docs[i].num_bytes for i in pick))
  return out
