r"""Super experts (arXiv 2507.23279): ablating them against as many random and as many
most-frequently routed experts (moejax/studies/scorers/phenomena.py).

  python -m experiments.study --config=configs/studies/phenomena.py \
      [--config.settings.workdir=runs/zoo/s] [--config.draws=3]

Draw d reads the bytes [4096 d, 4096 (d + 1)) of every held-out domain of the model's
data (its eval split), in windows of the training seq_len; the super experts are named
on that block by the official profiler's rule (settings.rule='official': the first 75%
of the blocks, P99.5 and max // 10 over them; 'massive_layers' is our earlier guess)
and every arm is scored on it, with the probes (arithmetic among them) drawn with
seed d. Where a rule names no super expert the super_experts arm ablates the expert of
largest a instead (`top_a`); super_experts_found says which. The profile alone
(a_{l,e}, massive activations, sinks): experiments/profile_phenomena.py.
"""

import ml_collections

from moejax.studies import scoring
from moejax.train import zoo


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.name = "phenomena"
  c.description = (
    "Su et al. (arXiv 2507.23279) find a handful of super experts, whose largest outputs "
    "make the massive activations behind attention sinks; ablating them (zeroing the down "
    "projection, the router untouched) collapses the sinks and breaks the model, while "
    "ablating as many random or most frequently used experts does little. Every arm "
    "ablates n experts of a trained MoE LM (n = the number of super experts, 1 when "
    "none); draw d is the d-th block of 4096 held-out bytes per domain."
  )
  c.scorer = "phenomena_ablation"
  c.settings = scoring.defaults_with(c.scorer)
  c.arms = [
    {"name": "none", "ablate": "none"},
    {"name": "super_experts", "ablate": "super_experts"},
    {"name": "most_frequent", "ablate": "most_frequent"},
    {"name": "random", "ablate": "random"},
  ]
  c.draws = 5
  c.reference = "none"
  c.claims = [
    {
      "arm": "super_experts",
      "reference": "none",
      "metric": "bpb",
      "expect": "higher",
      "text": "ablating the super experts raises bpb",
    },
    {
      "arm": "super_experts",
      "reference": "random",
      "metric": "bpb",
      "expect": "higher",
      "text": "super experts matter more than random experts",
    },
    {
      "arm": "super_experts",
      "reference": "most_frequent",
      "metric": "bpb",
      "expect": "higher",
      "text": "super experts matter more than the most used experts",
    },
    {
      "arm": "super_experts",
      "reference": "none",
      "metric": "mean_mass_on_position_0",
      "expect": "lower",
      "text": "ablating the super experts collapses the attention sinks",
    },
    {
      "arm": "super_experts",
      "reference": "random",
      "metric": "probe/arithmetic",
      "expect": "lower",
      "text": "arithmetic suffers more from the super experts than from random experts",
    },
    {
      "arm": "super_experts",
      "reference": "most_frequent",
      "metric": "probe/arithmetic",
      "expect": "lower",
      "text": "arithmetic suffers more from the super experts than from the most used experts",
    },
    {
      "arm": "super_experts",
      "reference": "none",
      "metric": "super_experts_found",
      "expect": None,
      "source": "ours",
      "text": "super experts the rule names per draw",
    },
  ]
  return zoo.over_seeds(c, arg)
