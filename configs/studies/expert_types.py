r"""Expert types at equal active FLOPs and equal steps (moejax/studies/scorers/training.py).

  python -m experiments.study --config=configs/studies/expert_types.py [--config.draws=3]

Shares its workdir with configs/studies/routers.py, so the top-k MoE (the same arm,
same config) trains once. Every arm: 600 steps, 32 x 128 bytes per step, evaluation
every 100 steps on the held-out plays; one draw (seed 0), the budget of the committed
sweep (docs/results/ablations/expert_types.md): --config.draws=N for intervals.
Active FFN FLOPs per token are the default MoE's in every arm (each config's docstring
has the arithmetic; dense is 0.5% under, its d_ff being 2 x 256).

  dense          the dense twin (SwiGLU d_ff 512)
  topk           the default MoE: top-2 of 8 SwiGLU experts of width 256
  omnimoe        OmniMoE: shared SwiGLU 448 + top-32 of 4096 atomic experts (64 x 64 grid)
  l3             dense (d_ff 480) + one L3 layer after block 1: 4096 rows, <= 64 per byte id
  l3_iso_params  dense (d_ff 448) + one L3 layer: 12288 rows, <= 256 per byte id, so its
                 total parameters match the MoE's (the paper's iso-sparse comparison)
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "expert_types"
  c.description = (
    "Dense, top-k MoE, OmniMoE and L3 (arXiv 2601.21461) at the default MoE's active "
    "FLOPs, 600 steps on the Shakespeare plays. L3 claims lower loss than dense and than "
    "the iso-sparse MoE at equal active FLOPs; compared on the final validation bpb."
  )
  c.scorer = "training"
  c.settings = {
    "workdir": "runs/routers",
    "steps": 600,
    "seeds": (),
    "common": ("train.eval_every=100",),
    "heldout_bytes_per_domain": 0,
    "domains": (),
  }
  c.arms = [
    {"name": "dense", "config": "configs/lm_shakespeare_dense.py"},
    {"name": "topk", "config": "configs/lm_shakespeare_moe.py"},
    {"name": "omnimoe", "config": "configs/lm_shakespeare_omnimoe.py"},
    {"name": "l3", "config": "configs/lm_shakespeare_l3.py"},
    {"name": "l3_iso_params", "config": "configs/lm_shakespeare_l3.py:budget=12288,cap=256"},
  ]
  c.draws = 1
  c.reference = "dense"
  c.claims = [
    {
      "arm": "l3",
      "reference": "dense",
      "metric": "val_bpb",
      "expect": "lower",
      "text": "L3: lower bpb than dense at equal active FLOPs",
    },
    {
      "arm": "l3_iso_params",
      "reference": "topk",
      "metric": "val_bpb",
      "expect": "lower",
      "text": "L3: lower bpb than the iso-sparse MoE",
    },
    {
      "arm": "topk",
      "reference": "dense",
      "metric": "val_bpb",
      "expect": "lower",
      "source": "ours",
      "text": "the top-k MoE beats dense at equal active FLOPs",
    },
  ]
  return c
