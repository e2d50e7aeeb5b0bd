r"""Capacity-aware Token Drop and Expanded Drop (arXiv 2503.05066) on a trained MoE LM,
against its own top-k (moejax/studies/scorers/router_inference.py).

  python -m experiments.study --config=configs/studies/router_inference_capacity.py \
      [--config.settings.workdir=runs/moe]

The model: the routers study's top-k run (configs/studies/routers.py, seed 0: the
default MoE LM, 600 steps). Draw d is validation batch d (32 x 128 tokens, one call,
as a prefill); the capacity is C = ceil(gamma k T / E) per expert and call.
  top_k          the model's own router (no capacity)
  token_drop     each over-full expert keeps its C routed tokens of highest probability
  expanded_drop  the released code's variant: candidates are each token's top-ceil(k r)
                 experts (r = 2), the same per-expert capacity, then each token's top-k
                 survivors (the paper's device-local expansion is not modelled)
"""

import ml_collections

from moejax.studies.spec import grid


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "router_inference_capacity"
  c.description = (
    "Capacity-aware inference (arXiv 2503.05066): MoE latency follows the busiest "
    "expert's load, so capping each expert at C = gamma x the mean load cuts it; the "
    "paper reports little loss from Token Drop (+0.9% on OLMoE at a 30% speed-up) and "
    "less from Expanded Drop. The trained default MoE LM, re-routed at inference only; "
    "draw d is validation batch d."
  )
  c.scorer = "router_inference_capacity"
  c.settings = {"workdir": "runs/routers/topk/seed_0"}
  c.arms = [
    {"name": "top_k", "router": "model"},
    {"name": "token_drop", "router": "capacity_aware", "expand_r": 1.0},
    {"name": "expanded_drop", "router": "capacity_aware", "expand_r": 2.0},
  ]
  c.levels = grid(("gamma", [0.5, 1.0, 1.5, 2.0]))
  c.draws = 8
  c.reference = "top_k"
  c.claims = [
    {
      "arm": "token_drop",
      "reference": "top_k",
      "metric": "max_load",
      "expect": "lower",
      "text": "Token Drop caps the busiest expert's load",
    },
    {
      "arm": "token_drop",
      "reference": "top_k",
      "metric": "bpb",
      "expect": "higher",
      "at": {"gamma": 1.0},
      "text": "Token Drop costs a little bpb (paper: +0.9%)",
    },
    {
      "arm": "expanded_drop",
      "reference": "token_drop",
      "metric": "bpb",
      "expect": "lower",
      "text": "Expanded Drop loses less than Token Drop",
    },
  ]
  return c
