"""FlyPrompt (ICLR 2026, arXiv 2602.01976) on the class-incremental digits stream with
blurry task boundaries: its random expanded analytic router (REAR) against ridge
without expansion (M = 0), key matching and the oracle task
(moejax/continual/flyprompt.py).

Arms name a router of flyprompt.ROUTERS (`router`, the arm's name by default). Draws
as digits_stream.py says; one training per draw (prompt experts, TE^2 heads, router
statistics: none depends on the router) scores every arm, so the arms differ only in
the expert each test image is routed to. Metrics: routing_accuracy, final_accuracy,
auc_accuracy (area under the accuracy curve), forgetting, online_final_accuracy
(the online head alone). Its picture: routing by task (plot).
"""

from __future__ import annotations

from moejax.studies.scorers.digits_stream import STREAM_INTEGERS, STREAM_SETTINGS, DigitsStream
from moejax.studies.scoring import PAIRING, SCORERS

METRICS = (
  "routing_accuracy",
  "final_accuracy",
  "auc_accuracy",
  "forgetting",
  "online_final_accuracy",
)


@SCORERS.register("flyprompt")
class FlyPrompt(DigitsStream):
  settings = {
    **STREAM_SETTINGS,
    "prompt_length": 2,  # key/value pairs per expert and head (the paper: 20 tokens)
    "width": 1000,  # REAR's M (the paper: 10000 for d = 768)
    "ridge": 1e4,  # gamma (the paper's)
    "decays": [0.9, 0.99],  # TE^2's EMA heads (the paper's)
    "blurry": 0.1,  # our choice: 10% of each task's rows from its neighbours
  }
  arm_settings = {"router": None}
  arm_key = "router"
  integer_settings = (*STREAM_INTEGERS, "prompt_length")

  def __init__(self, spec):
    super().__init__(spec)
    self.routing: dict[str, list] = {}  # arm: its routing matrices, one per draw scored

  def metrics(self):
    return METRICS

  def choices(self):
    from moejax.continual.flyprompt import ROUTERS

    return ROUTERS

  def setup_values(self) -> dict:
    """Setup's fields: one expert of prompt_length pairs per task (no top-K, no warm-up)."""
    experts = self.settings["prompt_length"] * self.tasks()
    return {**self.settings, "experts": experts, "top_k": 1, "warmup": 0}

  def fly(self):
    from moejax.continual.flyprompt import FlySetup

    s = self.settings
    decays = s["decays"]
    decays = tuple(decays) if isinstance(decays, (list, tuple)) else decays
    return FlySetup(width=s["width"], ridge=s["ridge"], decays=decays, blurry=s["blurry"])

  def check(self) -> None:
    super().check()
    self.fly().check(prefix="study.settings")

  def score(self, level, draw, arms):
    from moejax.continual.flyprompt import run_flyprompt

    seed, (backbone, data, tasks), key = self.draw(draw)
    routers = sorted({self.choice(name) for name in arms})
    result = run_flyprompt(self.setup(), self.fly(), backbone, data, tasks, seed, routers)
    out: dict[str, dict] = {}
    for name in arms:
      own = result[self.choice(name)]
      out[name] = {metric: float(own[metric]) for metric in METRICS}
      out[name][PAIRING] = key
      self.routing.setdefault(name, []).append(own["routing_matrix"])
    return out

  def plot(self, results, path) -> bool:
    """Routing by task: per arm, the share of each task's test images (rows) routed to
    each task's expert (columns) after the last task, mean over the draws scored in
    this process. With nothing scored here (a resume of a finished study) the picture
    at `path` is kept, or the default plot drawn where there is none."""
    if not self.routing:
      import os

      return os.path.exists(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [name for name, _ in self.spec.arms if name in self.routing]
    fig, axes = plt.subplots(1, len(names), figsize=(2.6 * len(names), 2.8), squeeze=False)
    for ax, name in zip(axes[0], names):
      mean = np.mean(self.routing[name], axis=0)
      ax.imshow(mean, vmin=0, vmax=1, cmap="viridis")
      for (i, j), share in np.ndenumerate(mean):
        ax.text(
          j,
          i,
          f"{share:.2f}",
          ha="center",
          va="center",
          fontsize=6,
          color="black" if share > 0.5 else "white",
        )
      ax.set_title(f"{name}\n({len(self.routing[name])} draws)", fontsize=8)
      ax.set_xlabel("routed to expert of task", fontsize=7)
      ax.set_xticks(range(len(mean))), ax.set_yticks(range(len(mean)))
    axes[0, 0].set_ylabel("test image's task", fontsize=7)
    fig.suptitle("FlyPrompt study: routing by task after the last task", fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True
