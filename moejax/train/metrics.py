"""Metric writers: TensorBoard event files, a JSONL log and the expert-load plot."""
import json
import math
import os

import numpy as np
from tensorboardX import SummaryWriter


def flatten_metrics(metrics: dict, moe_layers: list[int]) -> dict:
  """{'loss': x, 'moe': [layer dicts]} -> flat {'moe/layer3/routing_entropy': x, ...}.

  Vector metrics (per-expert load) become one entry per expert.
  """
  flat = {}
  for key, value in metrics.items():
    if key == "moe":
      for layer, layer_metrics in zip(moe_layers, value):
        for name, v in layer_metrics.items():
          v = np.asarray(v)
          if v.ndim == 0:
            flat[f"moe/layer{layer}/{name}"] = float(v)
          else:
            for e, ve in enumerate(v.reshape(-1)):
              flat[f"moe/layer{layer}/{name}/e{e}"] = float(ve)
    else:
      flat[key] = float(np.asarray(value))
  return flat


class MetricWriter:
  """Writes each record to TensorBoard and appends it to WORKDIR/metrics.jsonl."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
    self.tb = SummaryWriter(os.path.join(workdir, "tensorboard")) if enabled else None

  def write(self, step: int, scalars: dict) -> None:
    if not self.enabled:
      return
    for key, value in scalars.items():
      if math.isfinite(value):
        self.tb.add_scalar(key, value, step)
    with open(self.jsonl_path, "a") as f:
      f.write(json.dumps({"step": step, **scalars}) + "\n")

  def close(self):
    if self.enabled:
      self.tb.close()


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def plot_expert_load(jsonl_path: str, png_path: str) -> bool:
  """One panel per MoE layer: each expert's load fraction over training steps."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  records = [r for r in read_jsonl(jsonl_path) if any("load_fraction" in k for k in r)]
  if not records:
    return False
  layers = sorted({k.split("/")[1] for k in records[-1] if "/load_fraction/" in k},
                  key=lambda s: int(s.removeprefix("layer")))
  fig, axes = plt.subplots(len(layers), 1, figsize=(7, 2.2 * len(layers)),
                           sharex=True, squeeze=False)
  steps = [r["step"] for r in records]
  for ax, layer in zip(axes[:, 0], layers):
    experts = sorted((k for k in records[-1] if k.startswith(f"moe/{layer}/load_fraction/")),
                     key=lambda k: int(k.rsplit("/e", 1)[1]))
    for key in experts:
      ax.plot(steps, [r.get(key, np.nan) for r in records], lw=1,
              label=key.rsplit("/", 1)[1])
    ax.axhline(1.0 / len(experts), color="k", ls=":", lw=0.8)
    ax.set_ylabel(f"{layer}\nload fraction")
  axes[0, 0].legend(ncol=min(8, len(experts)), fontsize=6, loc="upper right")
  axes[-1, 0].set_xlabel("step")
  fig.suptitle("Expert load per MoE layer (dotted: uniform)")
  fig.tight_layout()
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
  return True
