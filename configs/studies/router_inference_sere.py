r"""SERE similarity-based expert re-routing (arXiv 2602.07616) in batched decoding on a
trained MoE LM, against its own top-k (moejax/studies/scorers/router_inference.py).

  python -m experiments.study --config=configs/studies/router_inference_sere.py

The model: the routers study's top-k run (configs/studies/routers.py, seed 0). Expert
similarity: linear CKA of every pair of experts' outputs on the first 2 training
batches (8,192 tokens). Draw d decodes validation windows [64 d, 64 d + 64),
teacher-forced, 64 tokens each, in decode batches of `batch` rows: every step's MoE call
routes `batch` tokens. rho: SERE re-routes a non-primary slot to its most similar
primary expert when their similarity is at least rho.
"""

import ml_collections

from moejax.studies.spec import grid


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "router_inference_sere"
  c.description = (
    "SERE (arXiv 2602.07616) re-routes, per decode batch, the experts outside the "
    "primary set to a similar primary expert, so a decode step reads fewer distinct "
    "experts; the paper reports up to 2x speed-up with minimal quality loss. The trained "
    "default MoE LM, teacher-forced KV-cache decoding; draw d is 64 validation windows."
  )
  c.scorer = "router_inference_sere"
  c.settings = {
    "workdir": "runs/routers/topk/seed_0",
    "calibration_batches": 2,
    "windows_per_draw": 64,
    "decode_len": 64,
  }
  c.arms = [{"name": "top_k", "router": "model"}, {"name": "sere", "router": "sere"}]
  c.levels = grid(("batch", [8, 16, 32, 64]), ("rho", [0.7, 0.5, 0.3, 0.2, 0.1]))
  c.draws = 4
  c.reference = "top_k"
  c.claims = [
    {
      "arm": "sere",
      "reference": "top_k",
      "metric": "distinct_experts",
      "expect": "lower",
      "text": "SERE reads fewer distinct experts per decode step",
    },
    {
      "arm": "sere",
      "reference": "top_k",
      "metric": "bpb",
      "expect": "higher",
      "text": "SERE costs a little bpb (paper: minimal quality loss)",
    },
  ]
  return c
