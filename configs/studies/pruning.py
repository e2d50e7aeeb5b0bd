r"""Expert pruning on a trained workdir: every method at keep 0.5 and 0.75 of the
routed experts on five calibration draws (moejax/studies/scorers/pruning.py).

  python -m experiments.study --config=configs/studies/pruning.py \
      [--config.settings.workdir=runs/zoo/s] [--config.draws=5]
"""

import ml_collections

from moejax.studies.spec import grid
from moejax.train import zoo

# Expert arms selected with the rescaled objective fold its least-squares weights into
# the kept experts (rescale), so the subset is all that differs between them.
RESCALED = ("schur_astar", "greedy", "frequency", "router_mass", "output_norm", "random")


def arms():
  """The unpruned model, the expert arms (rescaled, RESCALED), SCHUR-A* without the
  rescale, Step by merge rule and partner, HEAPr by per-expert normalisation and the
  atom baselines at the same fraction of atoms."""

  def arm(name, method, **settings):
    return {"name": name, "method": method, **settings}

  return (
    [arm("unpruned", "none")]
    + [arm(m, m, rescale=True) for m in RESCALED]
    + [
      arm("schur_astar_no_rescale", "schur_astar"),
      arm("step", "step", merge="average", partner="output"),
      arm("step_merge_by_coactivation", "step", merge="average", partner="contribution"),
      arm("step_no_merge", "step", merge="none"),
      arm("heapr", "heapr", normalisation="routed"),
      arm("heapr_mean", "heapr", normalisation="mean"),
      arm("heapr_sum", "heapr", normalisation="sum"),
      arm("heapr_first_order", "heapr_first_order"),
      arm("atom_magnitude", "atom_magnitude"),
      arm("atom_random", "atom_random"),
    ]
  )


def claims():
  """The pruning papers' claims (see ../shared/specs/PAPERS.md), on held-out bpb
  unless a metric is named; expect=None: a diagnostic with no expected direction."""

  def claim(arm, reference, text, expect="lower", source="paper", metric="bpb"):
    return {
      "arm": arm,
      "reference": reference,
      "metric": metric,
      "expect": expect,
      "source": source,
      "text": text,
    }

  return [
    # the search: against the other subset choices on the same rescaled objective
    claim(
      "schur_astar",
      "greedy",
      "SCHUR-A*: the optimal subset beats greedy selection (tests the search)",
    ),
    claim(
      "schur_astar", "output_norm", "SCHUR-A*: beats ranking by output energy (tests the search)"
    ),
    claim(
      "schur_astar",
      "frequency",
      "SCHUR-A* beats routing frequency, a baseline no "
      "better than random (not a test of the search)",
    ),
    claim(
      "frequency", "random", "routing frequency against a random subset", expect=None, source="ours"
    ),
    # the proxy: optimal on it by construction; does it survive deployment?
    claim(
      "schur_astar",
      "greedy",
      "SCHUR-A*'s proxy error is below greedy's (by construction)",
      source="ours",
      metric="proxy_error",
    ),
    claim(
      "schur_astar",
      "greedy",
      "SCHUR-A*'s deployed layer error (re-routed, renormalised) is below greedy's",
      source="ours",
      metric="layer_error",
    ),
    claim(
      "schur_astar",
      "schur_astar_no_rescale",
      "folding the least-squares weights into the kept experts",
      expect=None,
      source="ours",
    ),
    # Step (abstract only): its win over frequency is our spec's scenario
    claim("step", "frequency", "Step (scores + merge) beats routing frequency", source="spec"),
    claim(
      "step_no_merge", "frequency", "Step's scores alone beat routing frequency", source="ours"
    ),
    claim(
      "step",
      "step_no_merge",
      "Step's merge (mass-weighted mean of raw weights, "
      "partner by output similarity) against no merge",
      expect=None,
      source="ours",
    ),
    claim(
      "step",
      "step_merge_by_coactivation",
      "merge partner by output similarity against by co-activation (the routed-contribution Gram)",
      expect=None,
      source="ours",
    ),
    # HEAPr: atoms against whole experts, and the score against other atom scores at
    # the same number of atoms (granularity and score separated)
    claim(
      "heapr",
      "schur_astar",
      "HEAPr: atoms beat whole experts at equal expert parameters",
      source="spec",
    ),
    *[
      claim("heapr", baseline, f"HEAPr beats {what} at equal atoms", source="spec")
      for baseline, what in (("atom_random", "random atoms"), ("atom_magnitude", "atom magnitude"))
    ],
    claim(
      "atom_magnitude",
      "schur_astar",
      "atom magnitude against whole experts (granularity without HEAPr's score)",
      expect=None,
      source="ours",
    ),
    claim(
      "heapr",
      "heapr_first_order",
      "HEAPr's score against our first-order variant",
      expect=None,
      source="ours",
    ),
    claim(
      "heapr_mean",
      "heapr",
      "HEAPr normalised by n_e^2 (the paper's means) against by n_e (ours)",
      expect=None,
      source="ours",
    ),
    claim(
      "heapr_sum",
      "heapr",
      "HEAPr unnormalised against normalised by n_e",
      expect=None,
      source="ours",
    ),
  ]


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.name = "pruning"
  c.description = (
    "Expert pruning of a trained MoE (moejax/posttrain/prune.py): SCHUR-A* (the subset "
    "of least calibration error, A* with a Schur-complement bound), greedy selection, "
    "routing frequency, router mass, output energy and random rankings keep a fraction "
    "of each layer's experts, each with the rescaled objective's least-squares weights "
    "folded into the kept experts (schur_astar_no_rescale: without); the claims that "
    "test the search are against greedy and output energy (frequency is no better than "
    "random). Step: token-selective Taylor scores, the pruned experts merged into the "
    "kept by the mass-weighted mean of raw weights, partner by output similarity (or by "
    "co-activation, or no merge). HEAPr keeps that fraction of all expert atoms (hidden "
    "units) by its second-order score, normalised per expert by n_e (or n_e^2, or not), "
    "against atom magnitude and random atoms at the same number of atoms. proxy_error: "
    "the selection objective's relative error; layer_error: the deployed layer's "
    "(re-routed, renormalised) on the calibration tokens, both means over MoE layers. "
    "Draw d calibrates every method on the same windows (seed d); each pruned model is "
    "scored on the same held-out bytes per domain. The arm 'unpruned' is the source "
    "model."
  )
  c.scorer = "pruning"
  c.settings = {
    "workdir": "runs/zoo/s",
    "num_windows": 64,
    "bytes_per_domain": 65536,
    "probes": "auto",
    "probe_count": 16,
    "objective": "rescaled",
  }
  c.arms = arms()
  c.levels = grid(("keep", ["0.5", "0.75"]))
  c.draws = 5
  c.reference = "frequency"
  c.claims = claims()
  return zoo.over_seeds(c, arg)
