r"""Evaluate a model on held-out documents: bpb per domain, probes, routing.

  python -m experiments.evaluate --workdir=runs/moe --out=eval.json
  python -m experiments.evaluate --workdir=runs/moe --reference_workdir=runs/dense
  python -m experiments.evaluate --hf_dir=/ckpt/OLMoE --docs=heldout.jsonl --context=1024

--workdir (a training or converted workdir) or --hf_dir: the model. The held-out
documents are --docs (a .jsonl file of {"domain": ..., "text": ...} lines) or,
for a training workdir, the eval split of the data it trained on (the
document's `domain` feature, else the dataset name). --reference_workdir or
--reference_hf_dir adds the paired bootstrap of bpb(model) - bpb(reference)
per domain and the fraction of tokens whose top-k expert set changed. --probes
defaults to all probes for a workdir trained on data.name=mix (fact recall and
arithmetic read that corpus's own facts and held-out problems) and to the
passage probes otherwise. Prints a table; --out writes the whole report as
JSON. See moejax/evaluation/.
"""

import dataclasses
import json
import os

from absl import flags

from moejax import cli, cli_files
from moejax.models.structure import expert_counts
from moejax.errors import ConfigError
from moejax.evaluation import harness
from moejax.evaluation.model import DecoderLM
from moejax.evaluation.probe_data import PROBES, default_probes
from moejax.train.load import load_model
from moejax.train.checkpoint import latest_config

_WORKDIR = flags.DEFINE_string("workdir", None, "Training or converted workdir.")
_HF_DIR = flags.DEFINE_string("hf_dir", None, "HF checkpoint directory.")
_REF_WORKDIR = flags.DEFINE_string("reference_workdir", None, "Reference model's workdir.")
_REF_HF_DIR = flags.DEFINE_string("reference_hf_dir", None, "Reference HF directory.")
_DOCS = flags.DEFINE_string(
  "docs", None, "Held-out documents: .jsonl lines {\"domain\": str, \"text\": str}."
)
_PROBES = flags.DEFINE_list(
  "probes",
  None,
  "Probes to run (empty: none): " + ", ".join(PROBES) + "; default: all for a workdir trained on "
  "data.name=mix (its facts and held-out problems), else " + ",".join(default_probes(None)),
)
_CONTEXT = cli.checked(
  flags.DEFINE_integer(
    "context", 0, "Tokens per window; 0 = the training seq_len, else model.max_seq_len."
  ),
  cli.at_least(0),
)
_STRIDE = cli.checked(
  flags.DEFINE_integer("stride", 0, "Window advance; 0 = the context."), cli.at_least(0)
)
_BATCH = cli.checked(flags.DEFINE_integer("batch_size", 8, "Rows per model call."), cli.at_least(1))
_PROBE_COUNT = cli.checked(
  flags.DEFINE_integer("probe_count", 32, "Examples per probe group."), cli.at_least(1)
)
_RESAMPLES = cli.checked(
  flags.DEFINE_integer("bootstrap_resamples", 1000, "Bootstrap resamples."), cli.at_least(1)
)
_SEED = cli.checked(
  flags.DEFINE_integer("seed", 0, "Seed of probe data and bootstrap."), cli.in_range(0, 2**32 - 1)
)
_PREFIX = cli.checked(
  flags.DEFINE_integer(
    "prefix_id", -1, "Token read before each document; -1 = the tokenizer's separator."
  ),
  cli.at_least(-1),
)
_BYTES_PER_DOMAIN = cli.checked(
  flags.DEFINE_integer(
    "bytes_per_domain",
    0,
    "Score only the first N bytes of each domain's documents "
    "(whole documents, the last one cut); 0 = every byte.",
  ),
  cli.at_least(0),
)
_OUT = flags.DEFINE_string("out", None, "Write the report here as JSON.")


def read_docs(path: str) -> list[tuple[str, str]]:
  """(domain, text) of every line of a .jsonl file."""
  out = []
  for where, record in cli_files.json_lines("docs", path, ("domain", "text")):
    if not record["text"]:
      raise ConfigError(f"the text is empty: it encodes to no tokens {where}")
    out.append((record["domain"], record["text"]))
  if not out:
    raise ConfigError(f"no documents (--docs={path})")
  return out


def load(workdir, hf_dir, names=("workdir", "hf_dir")):
  """(LM, tokenizer, prefix id, experts per MoE layer, training config or None);
  `names`: the flags that gave workdir and hf_dir, for messages."""
  loaded, tokenizer, eos_id = load_model(workdir, hf_dir)
  where = f"(--{names[0]}={workdir})" if workdir else f"(--{names[1]}={hf_dir})"
  if tokenizer is None:
    raise ConfigError(f"the model has no tokenizer (tokenizer.json) to read documents with {where}")
  prefix = _PREFIX.value if _PREFIX.value >= 0 else getattr(tokenizer, "eos_id", eos_id)
  if prefix is None:
    raise ConfigError(f"the model names no separator (eos) token; give --prefix_id {where}")
  if prefix >= loaded.config.vocab_size:
    raise cli.flag_error(_PREFIX, f"expected a token id below {loaded.config.vocab_size}")
  config = None
  if workdir and os.path.isdir(os.path.join(workdir, "checkpoints")):
    config = latest_config(workdir)[0]  # the run's data split, for --split
  return (
    DecoderLM(loaded.config, loaded.params, loaded.rest),
    tokenizer,
    prefix,
    expert_counts(loaded.config),
    config,
  )


def main(argv):
  del argv
  cli_files.one_source(_WORKDIR, _HF_DIR)
  has_reference = _REF_WORKDIR.value is not None or _REF_HF_DIR.value is not None
  if has_reference:
    cli_files.one_source(_REF_WORKDIR, _REF_HF_DIR)
  cli_files.output_file("out", _OUT.value, not_inside=[("--docs", _DOCS.value)])
  chosen = None if _PROBES.value is None else tuple(p for p in _PROBES.value if p)
  harness.Settings(1, probes=chosen or ()).check()
  if _DOCS.value is not None:
    documents = read_docs(_DOCS.value)
  elif _WORKDIR.value is None or not os.path.isdir(os.path.join(_WORKDIR.value, "checkpoints")):
    raise ConfigError(
      "give --docs: only a training workdir names its held-out documents "
      f"(--workdir={_WORKDIR.value}, --hf_dir={_HF_DIR.value})"
    )
  # load both models and check the sizes before any document is read or scored
  lm, tokenizer, prefix, experts, config = load(_WORKDIR.value, _HF_DIR.value)
  ref = (
    load(_REF_WORKDIR.value, _REF_HF_DIR.value, (_REF_WORKDIR.name, _REF_HF_DIR.name))
    if has_reference
    else None
  )
  context = _CONTEXT.value or (config.data.seq_len if config else lm.max_seq_len)
  for model in (lm, ref[0] if ref else lm):
    if context > model.max_seq_len:
      raise cli.flag_error(_CONTEXT, f"expected at most model.max_seq_len={model.max_seq_len}")
  if _STRIDE.value > context:
    raise cli.flag_error(_STRIDE, f"expected at most the context, {context}")
  if _DOCS.value is None:
    from moejax.data.pipeline import split_documents

    documents = split_documents(config.data)
  documents = harness.sample_documents(documents, _BYTES_PER_DOMAIN.value)
  probes = default_probes(config.data.get("name") if config else None) if chosen is None else chosen
  settings = harness.Settings(
    context,
    _STRIDE.value or None,
    _BATCH.value,
    probes,
    _PROBE_COUNT.value,
    _SEED.value,
    _RESAMPLES.value,
  )
  result = harness.evaluate(lm, tokenizer, prefix, documents, settings, experts)
  report = {
    "model": _WORKDIR.value or _HF_DIR.value,
    "context": context,
    "bytes_per_domain": _BYTES_PER_DOMAIN.value,
    **result.report,
  }
  comparison = None
  if ref:
    ref_lm, ref_tokenizer, ref_prefix, ref_experts, _ = ref
    ref_eval = harness.evaluate(
      ref_lm,
      ref_tokenizer,
      ref_prefix,
      documents,
      dataclasses.replace(settings, probes=()),
      ref_experts,
    )
    comparison = harness.compare(
      result, ref_eval, settings, [max(a, b) for a, b in zip(experts, ref_experts)]
    )
    report["reference"] = {
      "model": _REF_WORKDIR.value or _REF_HF_DIR.value,
      "bpb": ref_eval.report["bpb"],
      **comparison,
    }
  print(harness.report_table(result.report, comparison))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
