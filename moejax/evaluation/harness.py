"""One model (and optionally a reference) through every part of the harness.

evaluate() scores held-out (domain, text) documents (bpb.py), runs the
probes (probes.py on probe_data.py examples) and, for an MoE model, the
routing diagnostics (routing.py); compare() adds the paired bootstrap of the
bpb difference per domain and, when both models read the same tokens, the
top-k set change per MoE layer.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation import bpb, probe_data, probes, routing, stats
from moejax.evaluation.model import LM


@dataclasses.dataclass
class Settings:
  context: int
  stride: int | None = None  # None: the context (non-overlapping windows)
  batch_size: int = 8
  probes: tuple[str, ...] = tuple(probe_data.PROBES)
  probe_count: int = 32  # examples per probe group (facts: people)
  seed: int = 0
  num_resamples: int = 1000

  def check(self) -> None:
    unknown = [p for p in self.probes if p not in probe_data.PROBES]
    if unknown:
      raise ConfigError(
        f"probe {unknown[0]!r} is not known; valid: "
        f"{', '.join(sorted(probe_data.PROBES))} (--probes={','.join(self.probes)})"
      )
    for name in ("context", "batch_size", "probe_count", "num_resamples"):
      if getattr(self, name) < 1:
        raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")


def sample_documents(
  documents: list[tuple[str, str]], bytes_per_domain: int
) -> list[tuple[str, str]]:
  """The first `bytes_per_domain` UTF-8 bytes of each domain's documents, in their
  order: whole documents while they fit, then the prefix of the next one that
  fills the budget (cut at a character boundary). Deterministic, so every model
  compared is scored on the same bytes; 0 keeps everything."""
  if bytes_per_domain < 0:
    raise ConfigError(f"bytes_per_domain={bytes_per_domain} must be >= 0 (0: every byte)")
  if bytes_per_domain == 0:
    return list(documents)
  used: dict[str, int] = {}
  out = []
  for domain, text in documents:
    left = bytes_per_domain - used.get(domain, 0)
    if left <= 0:
      continue
    data = text.encode("utf-8")
    if len(data) > left:  # the last document of the domain: its prefix
      text = data[:left].decode("utf-8", errors="ignore")
      used[domain] = bytes_per_domain
    else:
      used[domain] = used.get(domain, 0) + len(data)
    if text:
      out.append((domain, text))
  return out


@dataclasses.dataclass
class Evaluation:
  docs: list  # bpb.Document
  scores: bpb.DocumentScores
  report: dict  # JSON-ready


def evaluate(
  lm: LM,
  tokenizer,
  prefix_id: int,
  documents: list[tuple[str, str]],
  settings: Settings,
  num_experts: Sequence[int] = (),
) -> Evaluation:
  """bpb per domain, probe accuracies and (num_experts per MoE layer) routing."""
  settings.check()
  if not documents:
    raise ConfigError("no held-out documents to evaluate")
  if "all" in {d for d, _ in documents}:
    raise ConfigError("a domain may not be named 'all' (the name of the total)")
  docs = bpb.encode_documents(documents, tokenizer)
  scores = bpb.score_documents(
    lm,
    docs,
    prefix_id,
    context=settings.context,
    stride=settings.stride,
    batch_size=settings.batch_size,
  )
  report: dict[str, Any] = {
    "bpb": bpb.bpb_by_domain(docs, scores.nats),
    "documents": {
      d: sum(doc.domain == d for doc in docs) for d in sorted({doc.domain for doc in docs})
    },
    "tokens": int(scores.num_tokens.sum()),
    "bytes": int(sum(doc.num_bytes for doc in docs)),
    "probes": {},
  }
  for name in settings.probes:
    examples = probe_data.probe_examples(
      name, documents, settings.seed, settings.probe_count, settings.context
    )
    correct = probes.probe_correct(
      lm,
      tokenizer,
      prefix_id,
      examples,
      probe_data.PROBES[name],
      context=settings.context,
      batch_size=settings.batch_size,
    )
    report["probes"][name] = probes.accuracy_by_group(correct, [e.group for e in examples])
  if scores.routing:
    domains = sorted({doc.domain for doc in docs})
    index = {d: i for i, d in enumerate(domains)}
    token_domain = np.array([index[docs[d].domain] for d in scores.token_doc], np.int64)
    report["routing"] = routing.routing_report(
      scores.routing, token_domain, domains, list(num_experts)
    )
  return Evaluation(docs, scores, report)


def compare(
  model: Evaluation, reference: Evaluation, settings: Settings, num_experts: Sequence[int] = ()
) -> dict:
  """bpb(model) - bpb(reference): paired bootstrap per domain and overall; top-k set
  change per MoE layer when both read the same tokens and have the same MoE layers."""
  out: dict[str, Any] = {"difference": {}}
  for domain in model.report["bpb"]:
    pick = [i for i, d in enumerate(model.docs) if domain in ("all", d.domain)]
    out["difference"][domain] = stats.paired_bootstrap(
      model.scores.nats[pick],
      reference.scores.nats[pick],
      [model.docs[i].num_bytes for i in pick],
      num_resamples=settings.num_resamples,
      seed=settings.seed,
    ).as_dict()
  same_tokens = all(np.array_equal(a.tokens, b.tokens) for a, b in zip(model.docs, reference.docs))
  if not same_tokens:
    out["topk_set_changed"] = "not comparable: the models tokenize differently"
  elif len(model.scores.routing) != len(reference.scores.routing) or not model.scores.routing:
    out["topk_set_changed"] = "not comparable: different numbers of MoE layers"
  else:
    out["topk_set_changed"] = [
      routing.topk_set_changed(a, b, e)
      for a, b, e in zip(model.scores.routing, reference.scores.routing, num_experts)
    ]
  return out


def accuracy_text(accuracy) -> str:
  """A probe group's accuracy, or a dash where it has none."""
  return "—" if accuracy is None else f"{accuracy:.3f}"


def report_table(report: dict, reference: dict | None) -> str:
  """The lines experiments.evaluate prints: bpb per domain (and its difference to the
  reference, `compare`'s figures, with its interval), probe accuracies, routing per
  MoE layer, and the top-k set changes against the reference."""
  lines = ["domain | docs | bpb" + (" | bpb - reference [95% interval]" if reference else "")]
  for domain, value in report["bpb"].items():
    docs = report["documents"].get(domain, sum(report["documents"].values()))
    line = f"{domain} | {docs} | {value:.4f}"
    if reference:
      d = reference["difference"][domain]
      line += f" | {d['difference']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
    lines.append(line)
  for name, groups in report["probes"].items():
    lines.append(
      f"probe {name}: "
      + ", ".join(f"{g} {accuracy_text(v['accuracy'])} (n={v['n']})" for g, v in groups.items())
    )
  for j, layer in enumerate(report.get("routing", [])):
    lines.append(
      f"MoE layer {j}: I(domain; expert) {layer['mutual_information_bits']:.4f} "
      f"bits of H(domain) {layer['domain_entropy_bits']:.4f}, max/mean load "
      f"{layer['max_over_mean_load']:.3f}"
    )
  if reference and isinstance(reference["topk_set_changed"], list):
    lines.append(
      "top-k set changed vs reference: "
      + ", ".join(f"layer {j} {v:.3f}" for j, v in enumerate(reference["topk_set_changed"]))
    )
  return "\n".join(lines)
