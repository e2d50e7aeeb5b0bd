"""Draws docs/img/architecture.svg, the picture of the architecture page
(docs/architecture.md): how a config becomes a kernel call.

    .venv/bin/python scripts/architecture_diagram.py
"""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after matplotlib.use)
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402  (the same)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "img", "architecture.svg")

# (x, y, width, height, title, lines, colour); y grows upwards.
BOXES = {
  "config": (
    0.2,
    8.6,
    3.6,
    1.2,
    "config",
    ["configs/*.py: get_config()", "= base_config() + overrides"],
    "#e8eaf6",
  ),
  "validate": (
    4.4,
    8.6,
    3.6,
    1.2,
    "validation.py",
    ["every key and name checked,", "ConfigError before any compile"],
    "#e8eaf6",
  ),
  "registries": (
    8.6,
    8.6,
    4.2,
    1.2,
    "registries (registry.py)",
    ["name -> part: ROUTERS, EXPERT_TYPES,", "DISPATCHERS, GROUPED_MATMULS, LOSSES"],
    "#fff3e0",
  ),
  "train": (
    0.2,
    6.4,
    3.6,
    1.2,
    "train/ (experiments.train)",
    ["loop, step, checkpoints;", "never names a router"],
    "#e3f2fd",
  ),
  "model": (
    4.4,
    6.4,
    3.6,
    1.2,
    "models/decoder.py",
    ["MODELS['decoder']: attention,", "dense or MoE FFN per layer"],
    "#e3f2fd",
  ),
  "moe": (
    8.6,
    6.4,
    4.2,
    1.2,
    "layers/moe.py: the MoE layer",
    ["x [B, L, d] -> router -> Routing", "-> dispatch(experts) -> y"],
    "#e3f2fd",
  ),
  "router": (
    3.4,
    4.0,
    2.9,
    1.5,
    "routing/",
    ["model.moe.router", "logits (float32) ->", "Routing [T, S]"],
    "#e8f5e9",
  ),
  "losses": (
    0.2,
    4.0,
    2.9,
    1.5,
    "losses/",
    ["model.moe.loss_weights", "fn(RouterOutput)", "-> scalar"],
    "#e8f5e9",
  ),
  "dispatch": (
    6.6,
    4.0,
    3.0,
    1.5,
    "dispatch/",
    ["model.moe.dispatch", "capacity | dropless", "| dropless_memeff"],
    "#e8f5e9",
  ),
  "experts": (
    9.9,
    4.0,
    2.9,
    1.5,
    "experts/",
    ["model.moe.experts", "expert_fn(rows,", "matmul)"],
    "#e8f5e9",
  ),
  "gmm": (
    6.6,
    1.8,
    3.0,
    1.5,
    "grouped_matmul.py",
    ["model.moe.grouped_matmul", "loop | tiled | ragged_dot", "| gmm | fused | gather | auto"],
    "#fce4ec",
  ),
  "kernels": (
    9.9,
    1.8,
    2.9,
    1.5,
    "kernels/",
    ["Pallas gmm / tgmm:", "Mosaic (TPU), Triton", "(GPU), interpret (CPU)"],
    "#fce4ec",
  ),
  "tools": (
    0.2,
    1.8,
    6.1,
    1.5,
    "around the model",
    [
      "posttrain/ (prune, compress), studies/ (arms x draws),",
      "evaluation/ (bpb, stats), interop/ (HF import/export),",
      "inference/ (KV-cache generation), analysis/",
    ],
    "#f3e5f5",
  ),
}
ARROWS = [
  ("config", "validate"),
  ("validate", "registries"),
  ("config", "train"),
  ("train", "model"),
  ("model", "moe"),
  ("moe", "router"),
  ("router", "losses"),
  ("moe", "dispatch"),
  ("router", "dispatch"),
  ("dispatch", "experts"),
  ("dispatch", "gmm"),
  ("gmm", "kernels"),
  ("registries", "moe"),
]


def anchor(box, towards):
  x, y, w, h = box[:4]
  tx, ty, tw, th = towards[:4]
  cx, cy, tcx, tcy = x + w / 2, y + h / 2, tx + tw / 2, ty + th / 2
  if abs(tcy - cy) > (h + th) / 2:  # vertically apart: leave from the top or bottom edge
    return (cx + (tcx - cx) * 0.25, y if tcy < cy else y + h)
  return (x + w if tcx > cx else x, cy)


def main():
  fig, ax = plt.subplots(figsize=(13, 8.4))
  ax.set_xlim(0, 13)
  ax.set_ylim(1.5, 10)
  ax.axis("off")
  for x, y, w, h, title, lines, colour in BOXES.values():
    ax.add_patch(
      FancyBboxPatch(
        (x, y),
        w,
        h,
        boxstyle="round,pad=0.02,rounding_size=0.12",
        facecolor=colour,
        edgecolor="#37474f",
        linewidth=1.2,
      )
    )
    ax.text(
      x + w / 2,
      y + h - 0.22,
      title,
      ha="center",
      va="top",
      fontsize=12,
      weight="bold",
      family="DejaVu Sans",
    )
    ax.text(
      x + w / 2,
      y + h - 0.55,
      "\n".join(lines),
      ha="center",
      va="top",
      fontsize=10,
      family="DejaVu Sans Mono",
      linespacing=1.3,
    )
  for a, b in ARROWS:
    start, end = anchor(BOXES[a], BOXES[b]), anchor(BOXES[b], BOXES[a])
    ax.add_patch(
      FancyArrowPatch(
        start,
        end,
        arrowstyle="-|>",
        mutation_scale=14,
        color="#455a64",
        linewidth=1.2,
        shrinkA=2,
        shrinkB=2,
      )
    )
  fig.tight_layout()
  os.makedirs(os.path.dirname(OUT), exist_ok=True)
  fig.savefig(OUT, format="svg", metadata={"Date": None})
  print(f"wrote {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
  main()
