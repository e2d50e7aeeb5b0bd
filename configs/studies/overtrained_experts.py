r"""Overtrained experts merge worse (arXiv 2506.14126): four domain experts fine-tuned
from zoo-xs for many epochs over small pools, merged at every checkpoint by task
arithmetic (tuned scale) and TIES (moejax/studies/scorers/overtrained_experts.py,
moejax/merging/overtraining.py).

  python -m experiments.train --config=configs/zoo.py:model=xs --workdir=runs/zoo/xs
  python -m experiments.study --config=configs/studies/overtrained_experts.py
  python -m experiments.study --config=configs/studies/overtrained_experts.py:pool=120 \
      --out=docs/results/studies/overtrained_experts/pool_120

The base is zoo-xs's checkpoint at step 120 (20% of its 600 steps), and the sizes
below are small, for a shared 2-core CPU machine (the run times are in provenance.json).
"""

import ml_collections

from moejax.config import parse_config_arg
from moejax.studies.scorers.overtrained_experts import ARMS
from moejax.studies.spec import grid


def claims():
  def versus(arm, reference, expect, text, source="paper"):
    return {
      "arm": arm,
      "reference": reference,
      "metric": "loss",
      "expect": expect,
      "source": source,
      "text": text,
    }

  def alone(metric, null, expect, text, arm="merged_final"):
    return {
      "arm": arm,
      "metric": metric,
      "null": null,
      "expect": expect,
      "source": "paper",
      "text": text,
    }

  return [
    versus(
      "experts_final", "experts_early", "lower", "each expert keeps improving on its own domain"
    ),
    versus("merged_final", "merged_early", "higher", "the merge of the final experts is worse"),
    alone(
      "peak_fraction", 1.0, "lower", "the merge peaks before the last checkpoint", "merged_peak"
    ),
    versus("merged_stopped", "merged_final", "lower", "early-stopped experts merge better"),
    alone("forgetting_gap", 0.0, "higher", "the merge forgets the late-learned examples more"),
    alone("hardness_gap", 0.0, "higher", "the late-learned examples are the hard ones"),
  ]


def get_config(arg=None):
  pool = parse_config_arg(arg, {"pool": 16}).pool
  c = ml_collections.ConfigDict()
  c.name = "overtrained_experts"
  c.description = (
    "Overtrained experts: K=4 experts (drama, prose, code, facts of the mix corpus) "
    "fine-tuned from zoo-xs (its step-120 checkpoint) for 60 steps of 4 windows of 64 "
    f"bytes, cycling over a pool of {pool} training windows each ({60 * 4 / pool:.0f} "
    "epochs), at a constant "
    "learning rate 1e-3 (4 warmup steps), checkpointed every 12 steps. At each "
    "checkpoint the experts are merged with uniform weights by task arithmetic and by "
    "TIES (density 0.2), the scale of each tuned among 0.5, 1, 2 on the selection "
    "windows (scale 1: the mean task vector). early: step 24. Early stopping (our guess "
    "of the paper's rule): each expert stops at the first checkpoint whose gain on its "
    "own selection windows is below 0.1 of its gain since the base, keeping its best "
    "checkpoint up to there. Held-out: the first 1 KiB of each domain's validation "
    "documents, even windows for selection, odd ones for the test. Draw d: the seed of "
    "the pools, the epoch orders and the step keys."
  )
  c.scorer = "overtrained_experts"
  c.settings = {
    "workdir": "runs/zoo/xs",
    "step": 120,
    "domains": ["drama", "prose", "code", "facts"],
    "steps": 60,
    "checkpoint_every": 12,
    "early": 24,
    "pool": pool,
    "batch": 4,
    "learning_rate": 1e-3,
    "warmup": 4,
    "scales": [0.5, 1.0, 2.0],
    "density": 0.2,
    "tolerance": 0.1,
    "late_share": 0.5,
    "bytes_per_domain": 1024,
    "seq_len": 64,
  }
  c.arms = [{"name": n} for n in ARMS]
  c.levels = grid(("merge", ["task_arithmetic", "ties"]))
  c.draws = 2
  c.reference = "merged_final"
  c.claims = claims()
  return c
