r"""Token rounding (SonicMoE, arXiv 2512.14080) against top-k on several seeds
(moejax/studies/scorers/training.py).

  python -m experiments.study --config=configs/studies/token_rounding_seeds.py:base=zoo_xs

The bases, draws, workdirs and held-out scoring of configs/studies/routers_seeds.py (so
on the same workdir the topk runs of the router study are re-used). The paper claims
no loss against top-k while padding nothing, not a gain: the bpb claims carry no
direction and report the interval for what it is.

  topk              the baseline
  rounded_tile32    router=topk_rounded, tile 32 (dropless.tile 32: waste exactly 0)
  rounded_tile16    the same with tile 16
Committed result of the old runner: docs/results/ablations/token_rounding_zoo_xs.md.
"""

import ml_collections

from moejax.configs.studies.routers_seeds import base_settings


def get_config(arg=None):
  a, (path, base_arg, draws, heldout, _, title), name, settings = base_settings(
    arg, "token_rounding"
  )
  metric = "heldout_bpb" if heldout else "val_bpb"
  rounded = f"{path}:" + ",".join(filter(None, [base_arg, "router=topk_rounded"]))
  c = ml_collections.ConfigDict()
  c.name = name
  c.description = (
    f"Token rounding (SonicMoE) rounds every expert's token count to a tile multiple, "
    f"so no tile is padded; the paper claims top-k quality at zero padding. {title}, 600 "
    f"steps, every arm on the same seeds, compared on {metric}."
  )
  c.scorer = "training"
  c.settings = settings
  c.arms = [{"name": "topk", "config": f"{path}:{base_arg}" if base_arg else path}] + [
    {
      "name": f"rounded_tile{tile}",
      "config": rounded,
      "overrides": [f"model.moe.topk_rounded.tile={tile}", f"model.moe.dropless.tile={tile}"],
    }
    for tile in ((32, 16) if a.arms == "all" else ())
  ]
  c.draws = a.seeds or draws
  c.reference = "topk"
  c.claims = [
    claim
    for tile in ((32, 16) if a.arms == "all" else ())
    for claim in (
      {
        "arm": f"rounded_tile{tile}",
        "reference": "topk",
        "metric": metric,
        "expect": None,
        "text": f"SonicMoE: token rounding (tile {tile}) matches top-k's bpb",
      },
      {
        "arm": f"rounded_tile{tile}",
        "reference": "topk",
        "metric": "padding_waste",
        "expect": "lower",
        "text": f"SonicMoE: token rounding (tile {tile}) pads less",
      },
    )
  ]
  return c
