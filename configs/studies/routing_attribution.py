r"""Cross-layer contributions to MoE routing (ICLR 2026 list, OpenReview BqyPLOkxFY):
the causal check of the logit decomposition and the paper's headline, on trained MoE
LMs (moejax/studies/scorers/routing_attribution.py).

  python -m experiments.study --config=configs/studies/routing_attribution.py \
      [--config.settings.workdir=runs/zoo/s] [--config.draws=3]
  python -m experiments.study --config=configs/studies/routing_attribution.py:seeds=3

Draw d reads the bytes [512 d, 512 (d + 1)) of every held-out domain. The heatmap of
one model (MoE block x source): experiments/routing_attribution.py.
"""

import ml_collections

from moejax.studies import scoring
from moejax.train import zoo


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.name = "routing_attribution"
  c.description = (
    "The paper splits each router's logits into the model components that wrote its "
    "input (the RMSNorm factor frozen), recursively, and finds that earlier MoE layers' "
    "outputs contribute more to later routing than attention does. Its decomposition is "
    "exact by construction; the causal check is that removing the components it ranks "
    "most influential changes routing more than removing the least influential ones. "
    "Each arm removes n = 4 components (attention heads or earlier experts, by their "
    "influence on that block) for each MoE block in turn and counts the tokens whose "
    "routed set at that block changes. Ours: a byte-level 6-block model with 16 experts "
    "(zoo-s), not the paper's open LLMs; the recursion runs through attention only."
  )
  c.scorer = "routing_attribution"
  c.settings = scoring.defaults_with(c.scorer)
  c.arms = [
    {"name": "top", "ablate": "top"},
    {"name": "bottom", "ablate": "bottom"},
    {"name": "random", "ablate": "random"},
  ]
  c.draws = 3
  c.reference = "bottom"
  c.claims = [
    {
      "arm": "top",
      "reference": "bottom",
      "metric": "flip_rate",
      "expect": "higher",
      "text": "removing the most influential components flips routing more than the least",
    },
    {
      "arm": "top",
      "reference": "random",
      "metric": "flip_rate",
      "expect": "higher",
      "source": "ours",
      "text": "removing the most influential components flips routing more than random ones",
    },
    {
      "arm": "top",
      "metric": "moe_minus_attention",
      "expect": "higher",
      "text": "earlier MoE layers contribute more to routing than attention does",
    },
    {
      "arm": "top",
      "metric": "moe_share_recursive",
      "null": 0.5,
      "expect": "higher",
      "source": "ours",
      "text": (
        "earlier MoE layers write most of what routers read, attention split into what it moved"
      ),
    },
  ]
  return zoo.over_seeds(c, arg)
