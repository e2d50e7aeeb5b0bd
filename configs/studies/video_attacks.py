r"""TLGA-R, J-TLGA and J-TLAT (ICLR 2026; arXiv 2602.01369) on a space-time ViT-MoE
classifying moving-digit videos, against PGD and PGD adversarial training
(moejax/studies/scorers/video_attacks.py).

  python -m experiments.study --config=configs/studies/video_attacks.py
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "video_attacks"
  c.description = (
    "The paper attacks video MoE classifiers through their routers: TLGA-R steers the "
    "routers toward their lowest-confidence experts with per-frame steps scaled by the "
    "frame's gradient norm (a local Lipschitz estimate), J-TLGA adds that and an expert "
    "term to PGD's cross-entropy, and J-TLAT trains against the three in turn. The paper "
    "reports J-TLGA cutting UCF-101 robust accuracy from 11.10% (PGD) to 2.54%. Here, "
    "per seed: 8-frame 16x16 videos of a scikit-learn digit moving in one of 8 "
    "directions (the label; no single frame shows it), a 2-block space-time ViT whose "
    "FFNs are both MoE (4 experts, top-2, width 32, 4x4 patches, 128 tokens), trained "
    "800 Adam steps; the defences fine-tune it 100 adversarial steps (3-step attacks at "
    "8/255). Attacks: 10 sign steps of 2.5 eps / 10 at eps 2/255 and 8/255. The router "
    "and expert losses are our guess at the paper's (moejax/attacks/tlga.py)."
  )
  c.scorer = "video_attacks"
  c.settings = {"seed": 0}  # the rest: the scorer's defaults
  c.arms = [
    {"name": "pgd"},
    {"name": "tlga_r"},
    {"name": "j_tlga"},
    {"name": "pgd_at", "defence": "pgd_at", "attack": "j_tlga"},
    {"name": "j_tlat", "defence": "j_tlat", "attack": "j_tlga"},
  ]
  c.levels = [{}]
  c.draws = 3
  c.reference = "pgd"
  c.claims = [
    {
      "arm": "j_tlga",
      "reference": "pgd",
      "metric": f"robust_accuracy_{level}",
      "expect": "lower",
      "source": "paper",
      "text": f"J-TLGA leaves lower robust accuracy than PGD (eps {words})",
    }
    for level, words in (("low", "2/255"), ("high", "8/255"))
  ] + [
    {
      "arm": "tlga_r",
      "reference": "pgd",
      "metric": "flip_rate",
      "expect": "higher",
      "source": "spec",
      "text": "the router attack changes more routing decisions than PGD",
    },
    {
      "arm": "j_tlat",
      "reference": "pgd_at",
      "metric": "robust_accuracy_high",
      "expect": "higher",
      "source": "paper",
      "text": "J-TLAT is more robust to J-TLGA than PGD adversarial training",
    },
  ]
  return c
