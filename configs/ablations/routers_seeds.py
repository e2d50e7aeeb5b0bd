r"""The router ablation on 5 seeds, each research router against top-k with its
paper's claimed direction (issue 13, part 4). Not run yet: 35 runs of 600 steps.

  python -m experiments.ablate --config=configs/ablations/routers_seeds.py --workdir=runs/routers5

Same variants, budget and common overrides as configs/ablations/routers.py, minus
topk_seed1 (the seeds replace it). Every variant runs on seeds 0-4; the table
gives the paired per-seed difference in val bpb to topk, its 95% t-interval
and a verdict: "reproduces" only when the interval lies below 0 (every claim
here is "lower bpb than top-k"). expert_choice claims balance, not bpb: no
direction. The topk runs also give the baseline's own seed noise (its std).
"""
from moejax.configs.ablations import routers

EXPECT = {"probmoe_exact": "lower", "probmoe_dynamic": "lower", "smooth_topk": "lower",
          "dpsl": "lower", "mahalanobis": "lower"}


def get_config():
  c = routers.get_config()
  del c.seed
  c.seeds = (0, 1, 2, 3, 4)  # a tuple: --config.seeds="(0, 1, 2)" overrides it
  c.title = "Router ablation on the Shakespeare MoE LM, 5 seeds"
  c.variants = tuple((name, spec, overrides, EXPECT.get(name))
                     for name, spec, overrides in c.variants if name != "topk_seed1")
  return c
