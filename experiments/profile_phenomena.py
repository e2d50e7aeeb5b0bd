r"""Do super experts, massive activations and attention sinks appear in a trained model?

  python -m experiments.profile_phenomena --workdir=runs/zoo/s --out=phenomena.json

Reads the held-out documents of the data the workdir trained on (its eval split, as
experiments/evaluate.py does; --bytes_per_domain keeps the first N bytes of each domain),
writes each domain as one stream of [separator] + document tokens and cuts it into
windows of --context tokens (the remainder is left out; moejax/analysis/phenomena.py),
then runs moejax/analysis/super_experts.profile on all windows in one program: a_{l,e}
per MoE layer and expert, the super experts (arXiv 2507.23279), the residual stream's
massive activations per block and the attention mass on position 0 per layer (with the
uniform-attention baseline). Prints a table; --out writes the whole profile as JSON.
The ablation of the super experts against random and most-frequent experts is a study:
python -m experiments.study --config=configs/studies/phenomena.py.
"""

import json

from absl import flags

from moejax import cli, cli_files

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir (checkpoints/).")
_BYTES_PER_DOMAIN = cli.checked(
  flags.DEFINE_integer(
    "bytes_per_domain",
    4096,
    "Read only the first N bytes of each domain's held-out "
    "documents; 0 = every byte (all windows run in one program).",
  ),
  cli.at_least(0),
)
_CONTEXT = cli.checked(
  flags.DEFINE_integer("context", 0, "Tokens per window; 0 = the training seq_len."),
  cli.at_least(0),
)
_QUANTILE = cli.checked(
  flags.DEFINE_float("quantile", 99.5, "SE: a above this percentile of all a, in [0, 100]."),
  cli.in_range(0, 100),
)
_FRACTION = cli.checked(
  flags.DEFINE_float(
    "fraction_of_max", 0.1, "SE: a above this fraction of the largest a, in [0, 1]."
  ),
  cli.in_range(0, 1),
)
_MIN_RATIO = cli.checked(
  flags.DEFINE_float("min_ratio", 100.0, "Massive activations: max / median |h| at least this."),
  cli.in_range(0, float("inf"), low_open=True),
)
_GROWTH = cli.checked(
  flags.DEFINE_float(
    "growth", 2.0, "Massive activations form in a block whose max |h| grows at least this much."
  ),
  cli.in_range(0, float("inf"), low_open=True),
)
_OUT = flags.DEFINE_string("out", None, "Write the profile here as JSON.")
flags.mark_flag_as_required("workdir")


def table(report: dict) -> str:
  massive, sinks = report["massive_activations"], report["attention_sinks"]
  lines = [
    f"{report['tokens'][0]} windows of {report['tokens'][1]} tokens; uniform "
    f"attention would put {sinks['uniform_baseline']:.3f} on position 0",
    "block | MoE | max |h| (row, position, channel) | max / median | mass on position 0 | max a_e",
  ]
  peaks = dict(zip(report["moe_blocks"], report["expert_output_peaks"]))
  for i, layer in enumerate(massive["layers"]):
    peak = max((v for v in peaks.get(i, []) if v is not None), default=None)
    lines.append(
      f"{i} | {'yes' if i in peaks else 'no'} | {layer['max']:.2f} ({layer['row']}, "
      f"{layer['position']}, {layer['channel']}) | {layer['ratio']:.1f} | "
      f"{sinks['mass_on_position_0'][i]:.3f} | " + ("—" if peak is None else f"{peak:.2f}")
    )
  lines.append(f"massive activations form in blocks: {massive['massive_layers'] or 'none'}")

  def describe(found):
    return (
      ", ".join(f"block {p['block']} expert {p['expert']} (a={p['a']:.2f})" for p in found)
      or "none"
    )

  lines.append(
    f"super experts: {describe(report['super_experts'])}; by the two thresholds "
    f"alone: {describe(report['super_experts_unfiltered'])}"
  )
  return "\n".join(lines)


def main(argv):
  del argv
  cli_files.existing_workdir("workdir", _WORKDIR.value, kinds=("training", "mixed"))
  cli_files.output_file("out", _OUT.value)
  from moejax.analysis import super_experts
  from moejax.analysis.phenomena import HeldOut

  held_out = HeldOut.load(_WORKDIR.value, _CONTEXT.value, key="--workdir", context_key="--context")
  _, windows, counts = held_out.windows(
    0,
    _BYTES_PER_DOMAIN.value,
    f"(--context={held_out.context}, --bytes_per_domain={_BYTES_PER_DOMAIN.value})",
  )
  report = {
    "model": _WORKDIR.value,
    "context": held_out.context,
    "bytes_per_domain": _BYTES_PER_DOMAIN.value,
    "windows_per_domain": counts,
  }
  report.update(
    super_experts.profile(
      (held_out.config, held_out.params, held_out.rest),
      windows,
      quantile=_QUANTILE.value,
      fraction_of_max=_FRACTION.value,
      min_ratio=_MIN_RATIO.value,
      growth=_GROWTH.value,
    )
  )
  print(table(report))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
