"""The sweep's report: one markdown table and one plot comparing the curves.

One seed: `markdown_table`, one row per variant. Several seeds (issue 13):
`seed_table`, one row per arm with the paired per-seed difference to the
baseline (the first arm), its 95% t-interval and a verdict
(moejax/train/seed_stats.py). `plot_curves` draws every run, so a
multi-seed sweep shows every seed's curve, one colour per arm.
"""
import math
import os

from moejax.train.metrics import read_jsonl
from moejax.train.seed_stats import paired_difference, verdict

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


def seed_table(results: list[dict], metric: str = "val_bpb") -> str:
  """One row per arm (first = baseline): n seeds, metric mean ± std, the paired
  difference to the baseline (mean ± std), its 95% interval, expect, verdict."""
  arms = {}
  for r in results:
    arms.setdefault(r["name"], {})[r["seed"]] = r
  baseline_name = results[0]["name"]
  baseline = arms[baseline_name]
  header = ["arm", "seeds", f"{metric} mean ± std", "delta vs " + baseline_name,
            "95% interval", "expect", "verdict"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for name, runs in arms.items():
    seeds = [s for s in runs if s in baseline]
    values = [runs[s][metric] for s in seeds]
    spread = f" ± {_std(values):.4f}" if len(values) > 1 else ""
    cells = [name, ",".join(map(str, seeds)), f"{sum(values) / len(values):.4f}{spread}"]
    expect = next(iter(runs.values())).get("expect")
    if name == baseline_name:
      cells += ["—", "—", "—", "baseline"]
    else:
      diff = paired_difference(values, [baseline[s][metric] for s in seeds])
      cells += [f"{diff.mean:+.4f}" + (f" ± {diff.std:.4f}" if diff.std is not None else ""),
                f"[{diff.lo:+.4f}, {diff.hi:+.4f}]" if diff.lo is not None else "undefined (n=1)",
                expect or "—", verdict(diff, expect, "{:.4f}")]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def _std(values) -> float:
  mean = sum(values) / len(values)
  return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def plot_curves(results: list[dict], png_path: str) -> None:
  """Training cross-entropy and validation bpb against steps: one line per run
  (every seed of every arm), one colour per arm."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
  colours = {}
  for r in results:
    name = r["name"]
    first = name not in colours
    colours.setdefault(name, f"C{len(colours) % 10}")
    style = dict(color=colours[name], label=name if first else None)
    records = read_jsonl(os.path.join(r["run_dir"], "metrics.jsonl"))
    by_step = {rec["step"]: rec for rec in records}
    steps = sorted(by_step)
    ax_train.plot(steps, [by_step[s].get("ce_loss", math.nan) for s in steps], lw=1, **style)
    val = [s for s in steps if "val_bpb" in by_step[s]]
    ax_val.plot(val, [by_step[s]["val_bpb"] for s in val], marker="o", ms=3, lw=1, **style)
  ax_train.set(xlabel="step", ylabel="train cross-entropy (nats/token)",
               title="training loss")
  ax_val.set(xlabel="step", ylabel="validation bits per byte", title="held-out split")
  ax_val.legend(fontsize=7)
  for ax in (ax_train, ax_val):
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
