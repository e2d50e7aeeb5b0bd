"""The sweep's report: one markdown table and one plot comparing the curves."""
import math
import os

from moejax.train.metrics import read_jsonl

COLUMNS = (  # (result key, header, format)
    ("val_bpb", "val bpb", "{:.3f}"),
    ("delta_bpb", "vs first", "{:+.1%}"),
    ("tokens_per_second", "tokens/s", "{:,.0f}"),
    ("params", "params", "{:,}"),
    ("max_over_mean_load", "max/mean load", "{:.2f}"),
    ("routing_entropy", "routing entropy (nats)", "{:.2f}"),
    ("dropped_fraction", "dropped", "{:.3f}"),
    ("padding_waste", "padding waste", "{:.3f}"),
)


def _cell(value, fmt: str) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "—"
  return fmt.format(value)


def markdown_table(results: list[dict]) -> str:
  """One row per variant; 'vs first' is the relative val-bpb change against row 1."""
  reference = results[0]["val_bpb"]
  header = ["variant"] + [title for _, title, _ in COLUMNS]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for r in results:
    row = {**r, "delta_bpb": r["val_bpb"] / reference - 1}
    lines.append("| " + " | ".join([r["name"]] + [_cell(row.get(key), fmt)
                                                   for key, _, fmt in COLUMNS]) + " |")
  return "\n".join(lines) + "\n"


def plot_curves(workdir: str, names: list[str], png_path: str) -> None:
  """Training cross-entropy and validation bpb against steps, one line per variant."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
  for name in names:
    records = read_jsonl(os.path.join(workdir, name, "metrics.jsonl"))
    by_step = {r["step"]: r for r in records}
    steps = sorted(by_step)
    ax_train.plot(steps, [by_step[s].get("ce_loss", math.nan) for s in steps], lw=1,
                  label=name)
    val = [s for s in steps if "val_bpb" in by_step[s]]
    ax_val.plot(val, [by_step[s]["val_bpb"] for s in val], marker="o", ms=3, lw=1,
                label=name)
  ax_train.set(xlabel="step", ylabel="train cross-entropy (nats/token)",
               title="training loss")
  ax_val.set(xlabel="step", ylabel="validation bits per byte", title="held-out plays")
  ax_val.legend(fontsize=7)
  for ax in (ax_train, ax_val):
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
