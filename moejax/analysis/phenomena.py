"""Held-out inputs for the phenomena of a trained MoE LM (moejax/analysis/super_experts.py):
blocks of each domain's held-out bytes, cut into windows, and the harness's bpb of a
model on them. The super-experts ablation study scores one block per draw
(moejax/studies/scorers/phenomena.py); the profile CLI (experiments/profile_phenomena.py)
reads the first block.

A block: the bytes [b N, (b + 1) N) of each domain's held-out documents, in order (a
document crossing a boundary is cut there, at a character boundary); block 0 is the
evaluation harness's sample_documents(documents, N), so every model and arm compared on
a block reads the same bytes. Windows: each domain's block as one stream of
[separator] + document tokens, cut into whole windows of `context` tokens
(evaluation/bpb.domain_windows; the remainder is left out).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.errors import ConfigError


def document_block(
  documents: list[tuple[str, str]], block: int, bytes_per_domain: int
) -> list[tuple[str, str]]:
  """(domain, text) of the bytes [block N, (block + 1) N) of each domain (module doc);
  N = 0: every byte, one block."""
  if bytes_per_domain == 0 and block == 0:
    return list(documents)
  if bytes_per_domain < 1 or block < 0:
    raise ConfigError(
      f"bytes_per_domain={bytes_per_domain} must be >= 1 (0: every byte, "
      f"block 0 only) and block={block} >= 0"
    )
  start, stop = block * bytes_per_domain, (block + 1) * bytes_per_domain
  offset: dict[str, int] = {}
  out = []
  for domain, text in documents:
    data = text.encode("utf-8")
    begin = offset.get(domain, 0)
    offset[domain] = begin + len(data)
    piece = data[max(start - begin, 0) : max(min(stop - begin, len(data)), 0)]
    text = piece.decode("utf-8", errors="ignore")
    if text:
      out.append((domain, text))
  return out


@dataclasses.dataclass
class HeldOut:
  """A trained MoE LM and its eval split's documents: config (loop layout), params,
  rest, tokenizer, separator (eos) id and `context` tokens per window."""

  config: object
  params: object
  rest: object
  tokenizer: object
  separator: int
  context: int
  documents: list

  @classmethod
  def load(
    cls, workdir: str, context: int = 0, key: str = "workdir", context_key: str = "context"
  ) -> "HeldOut":
    """ConfigError (naming `key`, or `context_key`) for a workdir that is not a training
    one, a model that is not an MoE, a
    context over model.max_seq_len or a tokenizer with no separator; context 0 = the
    training seq_len."""
    from moejax import cli_files
    from moejax.data.pipeline import split_documents
    from moejax.train.restore import load_from_workdir

    kind = cli_files.workdir_kind(workdir)
    if kind not in ("training", "mixed"):
      raise ConfigError(f"{key}={workdir!r} is not a training workdir (checkpoints/): {kind}")
    config, _, params, rest, tokenizer = load_from_workdir(workdir, for_generation=True)
    if config.model.ffn_type != "moe":
      raise ConfigError(
        f"model.ffn_type={config.model.ffn_type!r}: super experts need an "
        f"MoE model ({key}={workdir})"
      )
    context = context or config.data.seq_len
    if context > config.model.max_seq_len:
      raise ConfigError(
        f"{context_key}={context} must be at most model.max_seq_len={config.model.max_seq_len}"
      )
    separator = getattr(tokenizer, "eos_id", None)
    if separator is None:
      raise ConfigError(f"the tokenizer names no separator (eos) token ({key}={workdir})")
    return cls(config, params, rest, tokenizer, separator, context, split_documents(config.data))

  @classmethod
  def of_study(cls, settings: dict, context_setting: str = "context") -> "HeldOut":
    """HeldOut.load of a study's settings.workdir and settings.<context_setting>, its
    errors naming those keys."""
    return cls.load(
      settings["workdir"],
      settings[context_setting],
      key="study.settings.workdir",
      context_key=f"study.settings.{context_setting}",
    )

  def windows(
    self, block: int, bytes_per_domain: int, where: str = ""
  ) -> tuple[list, np.ndarray, dict]:
    """(documents, int32 [N, context] windows, {domain: windows}) of one block; a
    ConfigError (ending with `where`) when no domain has a whole window."""
    from moejax.evaluation.bpb import domain_windows

    documents = document_block(self.documents, block, bytes_per_domain)
    windows, counts = domain_windows(documents, self.tokenizer, self.separator, self.context)
    if not sum(counts.values()):
      raise ConfigError(
        f"block {block} of {bytes_per_domain} bytes per domain has no whole "
        f"window of {self.context} tokens; give a shorter context or more "
        f"bytes per domain {where}".rstrip()
      )
    return documents, windows, counts

  def bpb(
    self, documents, m, params, rest, probes=(), probe_count: int = 32, seed: int = 0
  ) -> dict:
    """{"bpb": per domain and "all", "probes": {name: accuracy}}: the harness's bits per
    byte of one model, and its accuracy on each of `probes` (probe_count examples per
    group, drawn with `seed`; moejax/evaluation/harness.py)."""
    from moejax.evaluation import harness
    from moejax.evaluation.model import DecoderLM

    settings = harness.Settings(
      context=self.context, batch_size=16, probes=tuple(probes), probe_count=probe_count, seed=seed
    )
    report = harness.evaluate(
      DecoderLM(m, params, rest), self.tokenizer, self.separator, documents, settings
    ).report
    return {
      "bpb": report["bpb"],
      "probes": {
        name: float("nan") if groups["all"]["accuracy"] is None else groups["all"]["accuracy"]
        for name, groups in report["probes"].items()
      },
    }
