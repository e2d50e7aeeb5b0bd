r"""SCHUR-A*'s layer budgets: each layer keeps the count at the knee of its err(m)
curve, against the same total kept uniformly (9 of 16 experts per layer on zoo-s)
(moejax/studies/scorers/pruning.py).

  python -m experiments.study --config=configs/studies/pruning_knee.py \
      [--config.settings.workdir=runs/zoo/s]

The uniform level is a count: on another model, override the levels (a count above
its experts per layer is refused before any run).
"""

import ml_collections

from moejax.configs.studies import pruning
from moejax.studies.spec import grid
from moejax.train import zoo


def get_config(arg=None):
  c = pruning.get_config()
  c.name = "pruning_knee"
  c.description = (
    "SCHUR-A* sets each layer's budget at the knee of err(m), the calibration error of "
    "the best m-subset as m grows (Kneedle). keep=knee: each method's own knee per "
    "layer; keep=9: 9 experts in every layer (zoo-s: 54 of 96, near the knees' total). "
    "kept_experts is the total over layers."
  )
  c.arms = [{"name": "unpruned", "method": "none"}] + [
    {"name": m, "method": m, "rescale": True} for m in ("schur_astar", "greedy", "frequency")
  ]
  c.levels = grid(("keep", ["knee", "9"]))
  c.claims = [
    claim
    for claim in pruning.claims()
    if claim["reference"] in ("frequency", "greedy")
    and claim["arm"] == "schur_astar"
    and claim["metric"] == "bpb"
  ]
  return zoo.over_seeds(ml_collections.ConfigDict(c.to_dict()), arg)
