r"""What drives each router: the exact decomposition of its logits over the
residual stream, summed by source (moejax/analysis/routing_attribution.py).

  python -m experiments.routing_attribution --workdir=runs/zoo/s --out=attr.json --plot=attr.png

Reads --num_windows windows of the held-out documents (as experiments.
profile_phenomena does), decomposes every MoE layer's router logits into the
embedding, each attention layer, each earlier MoE layer and dense FFN, and
reports each source's share of the influence (variance over tokens of its
logit contribution, summed over experts) per MoE layer, with the paper's
question: do earlier MoE layers drive routing more than attention does?
"""

import json

from absl import flags
import numpy as np

from moejax import cli, cli_files
from moejax.errors import ConfigError

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir (checkpoints/).")
_NUM_WINDOWS = cli.checked(
  flags.DEFINE_integer("num_windows", 16, "Held-out windows."), cli.at_least(1)
)
_OUT = flags.DEFINE_string("out", None, "Write the report here as JSON.")
_PLOT = flags.DEFINE_string("plot", None, "Write the heatmap (MoE layer x source) here.")
flags.mark_flag_as_required("workdir")


def plot(report: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  sources = list(dict.fromkeys(k for layer in report["layers"] for k in layer["share"]))
  grid = np.array([[layer["share"].get(s, np.nan) for s in sources] for layer in report["layers"]])
  fig, ax = plt.subplots(figsize=(1 + 0.6 * len(sources), 1 + 0.5 * len(grid)))
  image = ax.imshow(grid, cmap="viridis", vmin=0)
  ax.set_xticks(range(len(sources)), sources, rotation=60, ha="right")
  ax.set_yticks(range(len(grid)), [f"MoE block {row['block']}" for row in report["layers"]])
  ax.set_title("share of router-logit influence")
  fig.colorbar(image, ax=ax)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  cli_files.existing_workdir("workdir", _WORKDIR.value, kinds=("training", "mixed"))
  cli_files.output_file("out", _OUT.value)
  cli_files.output_file("plot", _PLOT.value, suffixes=cli_files.plot_suffixes())
  from moejax.analysis.routing_attribution import attribute, source_shares
  from moejax.data.pipeline import split_documents
  from moejax.evaluation.bpb import domain_windows
  from moejax.train.restore import load_from_workdir

  config, graphdef, params, rest, tokenizer = load_from_workdir(_WORKDIR.value, for_generation=True)
  if config.model.ffn_type != "moe":
    raise ConfigError(f"needs an MoE model (--workdir={_WORKDIR.value})")
  windows, _ = domain_windows(
    split_documents(config.data), tokenizer, tokenizer.eos_id, config.data.seq_len
  )
  if len(windows) < _NUM_WINDOWS.value:
    raise cli.flag_error(_NUM_WINDOWS, f"expected at most the {len(windows)} held-out windows")
  pick = np.linspace(0, len(windows) - 1, _NUM_WINDOWS.value).astype(int)
  layers = attribute(graphdef, params, rest, windows[pick])
  report = {"model": _WORKDIR.value, "windows": int(len(pick)), "layers": source_shares(layers)}
  print("MoE block | attention | earlier MoE | embedding | dense FFN")
  for layer in report["layers"]:
    dense = 1.0 - layer["attention"] - layer["moe"] - layer["embed"]
    print(
      f"{layer['block']} | {layer['attention']:.3f} | {layer['moe']:.3f} | "
      f"{layer['embed']:.3f} | {dense:.3f}"
    )
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=1)
  if _PLOT.value:
    plot(report, _PLOT.value)


if __name__ == "__main__":
  cli.run(main)
