"""Metric writers: TensorBoard event files, a JSONL log and the expert-load plot."""

import json
import math
import os
from typing import Any

import numpy as np


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
  """Writes each record to TensorBoard and appends it to WORKDIR/metrics.jsonl.

  start_step: the step the run starts from (the restored checkpoint's, 0 when
  fresh). Records of later steps were written by a run killed after that
  checkpoint and are about to be written again, so they are dropped from
  metrics.jsonl (`purge_jsonl`) and hidden in TensorBoard (tensorboardX's
  purge_step = start_step + 1 hides events at steps >= start_step + 1); every
  reader then sees one record per step.
  """

  def __init__(self, workdir: str, enabled: bool = True, start_step: int | None = None):
    self.enabled = enabled
    self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
    self.tb: Any = None  # tensorboardX.SummaryWriter (imported only when enabled)
    if enabled:
      tb_dir = os.path.join(workdir, "tensorboard")
      purge, suffix = None, ""
      if start_step is not None:
        purge_jsonl(self.jsonl_path, start_step)
        if os.path.isdir(tb_dir):  # only earlier event files need hiding
          # tensorboardX names event files by the second and opens them "wb": the
          # suffix keeps a resume within the same second from overwriting the
          # earlier file, and sorts after it.
          purge, suffix = start_step + 1, f".from{start_step:09d}"
      # Imported here: tensorboardX imports torch when it is installed (the test
      # environment has it), seconds that a run writing no metrics need not pay.
      from tensorboardX import SummaryWriter

      self.tb = SummaryWriter(tb_dir, purge_step=purge, filename_suffix=suffix)

  def write(self, step: int, scalars: dict) -> None:
    if not self.enabled:
      return
    for key, value in scalars.items():
      if math.isfinite(value) and self.tb is not None:
        self.tb.add_scalar(key, value, step)
    with open(self.jsonl_path, "a") as f:
      f.write(json.dumps({"step": step, **scalars}) + "\n")

  def close(self):
    if self.enabled:
      self.tb.close()


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def purge_jsonl(path: str, last_step: int) -> int:
  """Drop the records of `path` past `last_step` (and a line cut short by a kill);
  returns how many lines went. Crash safe: the kept lines go to a temporary file
  in the same directory, flushed to disk, which then replaces `path` atomically
  (os.replace), so a kill at any point leaves the old file or the new one."""
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    lines = f.read().splitlines()
  kept = []
  for line in lines:
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError:  # the last line of a killed write
      continue
    if record.get("step", 0) <= last_step:
      kept.append(line)
  dropped = len(lines) - len(kept)
  if dropped:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
      f.write("".join(line + "\n" for line in kept))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  return dropped


def expert_load_series(records: list[dict]):
  """What the expert-load plot draws: (steps, {layer: {expert: load fractions}}) over
  the records that hold load fractions, in file order."""
  records = [r for r in records if any("load_fraction" in k for k in r)]
  if not records:
    return [], {}
  layers = sorted(
    {k.split("/")[1] for k in records[-1] if "/load_fraction/" in k},
    key=lambda s: int(s.removeprefix("layer")),
  )
  series = {}
  for layer in layers:
    experts = sorted(
      (k for k in records[-1] if k.startswith(f"moe/{layer}/load_fraction/")),
      key=lambda k: int(k.rsplit("/e", 1)[1]),
    )
    series[layer] = {k.rsplit("/", 1)[1]: [r.get(k, np.nan) for r in records] for k in experts}
  return [r["step"] for r in records], series


def plot_expert_load(jsonl_path: str, png_path: str) -> bool:
  """One panel per MoE layer: each expert's load fraction over training steps."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  steps, series = expert_load_series(read_jsonl(jsonl_path))
  if not steps:
    return False
  fig, axes = plt.subplots(
    len(series), 1, figsize=(7, 2.2 * len(series)), sharex=True, squeeze=False
  )
  for ax, (layer, experts) in zip(axes[:, 0], series.items()):
    for name, values in experts.items():
      ax.plot(steps, values, lw=1, label=name)
    ax.axhline(1.0 / len(experts), color="k", ls=":", lw=0.8)
    ax.set_ylabel(f"{layer}\nload fraction")
  axes[0, 0].legend(ncol=min(8, len(experts)), fontsize=6, loc="upper right")
  axes[-1, 0].set_xlabel("step")
  fig.suptitle("Expert load per MoE layer (dotted: uniform)")
  fig.tight_layout()
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
  return True
