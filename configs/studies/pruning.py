r"""Expert pruning on a trained workdir: every method at keep 0.5 and 0.75 of the
routed experts on five calibration draws (moejax/studies/scorers/pruning.py).

  python -m experiments.study --config=configs/studies/pruning.py \
      [--config.settings.workdir=runs/zoo/s] [--config.draws=5]
"""
import ml_collections

from moejax.studies.spec import grid
from moejax.train import zoo

METHODS = ("heapr", "heapr_first_order", "atom_random", "schur_astar", "greedy", "step",
           "step_no_merge", "frequency", "router_mass", "output_norm", "random")


def claims():
  """The pruning papers' claims on held-out bpb (see ../shared/specs/PAPERS.md)."""
  bpb = lambda arm, reference, text, expect="lower", source="paper": {
      "arm": arm, "reference": reference, "metric": "bpb", "expect": expect,
      "source": source, "text": text}
  return [
      bpb("schur_astar", "frequency", "SCHUR-A*: the optimal subset beats routing frequency"),
      bpb("schur_astar", "greedy", "SCHUR-A*: the optimal subset beats greedy selection"),
      bpb("schur_astar", "output_norm", "SCHUR-A*: beats ranking by output energy"),
      # Step's paper is read as an abstract only: its win over frequency is the
      # scenario our spec tests (PAPERS.md: 'frequency prunes A, Step prunes B').
      bpb("step", "frequency", "Step (scores + merge) beats routing frequency", source="spec"),
      bpb("step_no_merge", "frequency", "Step's scores alone beat routing frequency",
          source="ours"),
      # HEAPr's small-scale expectation in our spec: HEAPr < expert-level < random atoms
      bpb("heapr", "schur_astar", "HEAPr: atoms beat whole experts at equal expert "
          "parameters", source="spec"),
      bpb("heapr", "atom_random", "HEAPr beats random atoms", source="spec"),
      bpb("heapr", "heapr_first_order", "HEAPr's score against our first-order variant",
          expect=None, source="ours"),
  ]


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.name = "pruning"
  c.description = (
      "Expert pruning of a trained MoE (moejax/posttrain/prune.py): SCHUR-A* (the subset "
      "of least calibration error, A* with a Schur-complement bound), greedy selection, "
      "Step (token-selective Taylor scores, then the pruned experts merged into the kept), "
      "routing frequency, router mass, output energy and random rankings keep a fraction "
      "of each layer's experts; HEAPr keeps that fraction of all expert atoms (hidden "
      "units) by its second-order score. Draw d calibrates every method on the same "
      "windows (seed d); each pruned model is scored on the same held-out bytes per "
      "domain. The arm 'unpruned' is the source model.")
  c.scorer = "pruning"
  c.settings = {"workdir": "runs/zoo/s", "num_windows": 64, "bytes_per_domain": 8192,
                "probes": "auto", "probe_count": 16, "objective": "rescaled"}
  c.arms = [{"name": "unpruned", "method": "none"}] + [{"name": m, "method": m}
                                                       for m in METHODS]
  c.levels = grid(("keep", ["0.5", "0.75"]))
  c.draws = 5
  c.reference = "frequency"
  c.claims = claims()
  return zoo.over_seeds(c, arg)
