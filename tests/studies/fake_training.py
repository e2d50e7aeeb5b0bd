"""A stand-in for training in the studies' scorers (`FakeTrain`: a metrics log and a
val bpb in closed form, no model) and `run`, which runs a study with it."""

import json
import os
import types

import numpy as np

from moejax.studies import runner


class FakeTrain:
  """Stands in for train_and_evaluate: writes a metrics log; val bpb = f(top_k, seed)."""

  def __init__(self, root=None):
    self.root, self.calls = root, []

  def __call__(self, config, run_dir):
    self.calls.append(os.path.relpath(run_dir, self.root))
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
      for step in range(1, config.train.steps + 1):
        f.write(
          json.dumps(
            {"step": step, "tokens_per_second": 1000.0 * config.seed + step, "ce_loss": 5.0 / step}
          )
          + "\n"
        )
    bpb = 2.0 + config.model.moe.top_k / 10 + config.seed / 100 + config.model.moe.num_experts
    return types.SimpleNamespace(
      state=types.SimpleNamespace(params={"w": np.zeros((3, 4))}),
      eval={"val_bpb": bpb, "val_loss": 1.0},
    )


def run(config, out, fake):
  spec, scorer = runner.prepare(config)
  scorer.train_fn = fake
  return runner.run(
    spec,
    scorer,
    str(out),
    stored=runner.check_output(spec, str(out)),
    plot=False,
    log=lambda _: None,
  )
