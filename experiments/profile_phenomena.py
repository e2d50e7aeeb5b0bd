r"""Do super experts, massive activations and attention sinks appear in a trained model?

  python -m experiments.profile_phenomena --workdir=runs/zoo/s --out=phenomena.json

Reads the held-out documents of the data the workdir trained on (its eval split,
as experiments/evaluate.py does; --bytes_per_domain keeps the first N bytes of
each domain), writes each domain as one stream of [separator] + document tokens
and cuts it into windows of --context tokens (the remainder is left out), then
runs moejax/analysis/super_experts.profile on all windows in one program:
a_{l,e} per MoE layer and expert, the super experts (arXiv 2507.23279), the
residual stream's massive activations per block and the attention mass on
position 0 per layer (with the uniform-attention baseline). Prints a table;
--out writes the whole profile as JSON.

  python -m experiments.profile_phenomena --workdir=runs/zoo/s --ablate --out=ablation.json \
      --markdown=ablation.md

--ablate runs super_experts.ablation_study on the same windows instead: the super
experts (or, when there are none, the --ablate_n experts of largest a) ablated
against --ablate_n most frequently routed and --ablate_n random experts (one arm
per --seeds), each arm scored by the harness's bits per byte on the same held-out
documents (evaluation/bpb.py), its attention mass on position 0 and its residual
max |h|. --markdown writes the arms' table.
"""
import functools
import json

from absl import flags

from moejax import cli
from moejax.errors import ConfigError

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir (checkpoints/).")
_BYTES_PER_DOMAIN = cli.checked(flags.DEFINE_integer(
    "bytes_per_domain", 4096, "Read only the first N bytes of each domain's held-out "
    "documents; 0 = every byte (all windows run in one program)."), cli.at_least(0))
_CONTEXT = cli.checked(flags.DEFINE_integer("context", 0, "Tokens per window; 0 = the "
                                            "training seq_len."), cli.at_least(0))
_QUANTILE = cli.checked(flags.DEFINE_float("quantile", 99.5, "SE: a above this percentile "
                                           "of all a."), cli.in_range(0, 100))
_FRACTION = cli.checked(flags.DEFINE_float("fraction_of_max", 0.1, "SE: a above this "
                                           "fraction of the largest a."), cli.in_range(0, 1))
_MIN_RATIO = cli.checked(flags.DEFINE_float("min_ratio", 100.0, "Massive activations: "
                                            "max / median |h| at least this."),
                         cli.at_least(0.0, float))
_GROWTH = cli.checked(flags.DEFINE_float("growth", 2.0, "Massive activations form in a "
                                         "block whose max |h| grows at least this much."),
                      cli.at_least(0.0, float))
_OUT = flags.DEFINE_string("out", None, "Write the profile here as JSON.")
_ABLATE = flags.DEFINE_bool("ablate", False, "Run the ablation study (super experts against "
                            "random and most frequent experts).")
_ABLATE_N = cli.checked(flags.DEFINE_integer(
    "ablate_n", 0, "Experts per random and most-frequent arm (and in the largest-a arm when "
    "there is no super expert); 0 = the number of super experts, 1 when none."),
    cli.at_least(0))
_SEEDS = cli.checked(flags.DEFINE_list("seeds", ["0", "1", "2"], "One random arm per seed."),
                     cli.at_least(0))
_MARKDOWN = flags.DEFINE_string("markdown", None, "With --ablate: write the arms' table here.")
flags.mark_flag_as_required("workdir")


def table(report: dict) -> str:
  massive, sinks = report["massive_activations"], report["attention_sinks"]
  lines = [f"{report['tokens'][0]} windows of {report['tokens'][1]} tokens; uniform "
           f"attention would put {sinks['uniform_baseline']:.3f} on position 0",
           "block | MoE | max |h| (row, position, channel) | max / median | mass on position 0 "
           "| max a_e"]
  peaks = dict(zip(report["moe_blocks"], report["expert_output_peaks"]))
  for i, layer in enumerate(massive["layers"]):
    peak = max((v for v in peaks.get(i, []) if v is not None), default=None)
    lines.append(f"{i} | {'yes' if i in peaks else 'no'} | {layer['max']:.2f} ({layer['row']}, "
                 f"{layer['position']}, {layer['channel']}) | {layer['ratio']:.1f} | "
                 f"{sinks['mass_on_position_0'][i]:.3f} | "
                 + ("—" if peak is None else f"{peak:.2f}"))
  lines.append(f"massive activations form in blocks: {massive['massive_layers'] or 'none'}")
  describe = lambda found: ", ".join(f"block {p['block']} expert {p['expert']} (a={p['a']:.2f})"
                                     for p in found) or "none"
  lines.append(f"super experts: {describe(report['super_experts'])}; by the two thresholds "
               f"alone: {describe(report['super_experts_unfiltered'])}")
  return "\n".join(lines)


def ablation_table(report: dict) -> str:
  """The arms as a markdown table, under a line saying whether super experts exist."""
  profile, sinks = report["profile"], report["profile"]["attention_sinks"]
  massive = profile["massive_activations"]
  ratio = max(layer["ratio"] for layer in massive["layers"])
  found = ", ".join(f"block {p['block']} expert {p['expert']}" for p in profile["super_experts"])
  lines = [f"{report['model']}: {profile['tokens'][0]} windows of {profile['tokens'][1]} tokens "
           f"(the first {report['bytes_per_domain']} held-out bytes of each domain; 0 = all); "
           f"{report['n']} expert(s) per arm; random seeds {report['seeds']}.", "",
           f"Super experts by the paper's rule: {found or 'none'} (massive activations form in "
           f"blocks {massive['massive_layers'] or 'none'}; largest residual max / median "
           f"{ratio:.1f}). Uniform attention would put {sinks['uniform_baseline']:.4f} on "
           f"position 0.", "",
           "| arm | experts (block:expert) | bpb | loss (nats/token) | mean mass on position 0 "
           "| max residual \\|h\\| |", "|---|---|---|---|---|---|"]
  for arm in report["arms"]:
    experts = ", ".join(f"{e['block']}:{e['expert']}" for e in arm["experts"]) or "—"
    lines.append(f"| {arm['arm']} | {experts} | {arm['bpb']['all']:.4f} | {arm['loss_nats']:.4f} "
                 f"| {arm['mean_mass_on_position_0']:.4f} | {arm['max_residual']:.2f} |")
  return "\n".join(lines)


def bpb_score(documents, tokenizer, prefix: int, context: int, m, params, rest) -> dict:
  """{"bpb": per domain and "all"}: the harness's bits per byte of one model."""
  from moejax.evaluation import bpb
  from moejax.evaluation.model import DecoderLM
  docs = bpb.encode_documents(documents, tokenizer)
  scores = bpb.score_documents(DecoderLM(m, params, rest), docs, prefix, context=context,
                               batch_size=16)
  return {"bpb": bpb.bpb_by_domain(docs, scores.nats)}


def main(argv):
  del argv
  cli.existing_workdir("workdir", _WORKDIR.value, kinds=("training", "mixed"))
  cli.output_file("out", _OUT.value)
  cli.output_file("markdown", _MARKDOWN.value)
  given = lambda holder: (f"--{holder.name}=" + (",".join(holder.value)
                                                 if holder is _SEEDS else f"{holder.value}"))
  for holder in (_ABLATE_N, _SEEDS, _MARKDOWN):
    if flags.FLAGS[holder.name].present and not _ABLATE.value:
      raise ConfigError(f"only the ablation study reads this flag; add --ablate ({given(holder)})")
  seeds = [int(s) for s in _SEEDS.value]
  if not seeds or len(set(seeds)) != len(seeds):
    raise ConfigError(f"expected distinct seeds, at least one ({given(_SEEDS)})")
  from moejax.analysis import super_experts
  from moejax.data.pipeline import split_documents
  from moejax.evaluation.bpb import domain_windows
  from moejax.evaluation.harness import sample_documents
  from moejax.train.restore import load_from_workdir
  config, _, params, rest, tokenizer = load_from_workdir(_WORKDIR.value, for_generation=True)
  if config.model.ffn_type != "moe":
    raise ConfigError(f"model.ffn_type={config.model.ffn_type!r}: super experts need an MoE "
                      f"model (--workdir={_WORKDIR.value})")
  from moejax.config import expert_counts
  if _ABLATE_N.value > sum(expert_counts(config.model)):
    raise cli.flag_error(_ABLATE_N, f"expected at most the model's "
                         f"{sum(expert_counts(config.model))} experts")
  context = _CONTEXT.value or config.data.seq_len
  if context > config.model.max_seq_len:
    raise cli.flag_error(_CONTEXT, f"expected at most model.max_seq_len="
                         f"{config.model.max_seq_len}")
  prefix = getattr(tokenizer, "eos_id", None)
  if prefix is None:
    raise ConfigError(f"the tokenizer names no separator (eos) token "
                      f"(--workdir={_WORKDIR.value})")
  documents = sample_documents(split_documents(config.data), _BYTES_PER_DOMAIN.value)
  windows, counts = domain_windows(documents, tokenizer, prefix, context)
  if not sum(counts.values()):
    raise ConfigError(f"no domain has a whole window of {context} tokens; give a shorter "
                      f"--context or more --bytes_per_domain (--context={context}, "
                      f"--bytes_per_domain={_BYTES_PER_DOMAIN.value})")
  criterion = dict(quantile=_QUANTILE.value, fraction_of_max=_FRACTION.value,
                   min_ratio=_MIN_RATIO.value, growth=_GROWTH.value)
  report = {"model": _WORKDIR.value, "context": context,
            "bytes_per_domain": _BYTES_PER_DOMAIN.value, "windows_per_domain": counts}
  if _ABLATE.value:
    report.update(super_experts.ablation_study(
        (config, params, rest), windows, n=_ABLATE_N.value or None, seeds=seeds,
        criterion=criterion, score=functools.partial(bpb_score, documents, tokenizer, prefix,
                                                      context)))
    text = ablation_table(report)
  else:
    report.update(super_experts.profile((config, params, rest), windows, **criterion))
    text = table(report)
  print(text)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=1)
  if _MARKDOWN.value:
    with open(_MARKDOWN.value, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  cli.run(main)
