r"""FedGEM, federated generalised EM with an unknown number of clusters (Ibrahim,
Gebraeel and Xie, arXiv 2601.21160; scorer moejax/studies/scorers/fedgem.py).

  python -m experiments.study --config=configs/studies/fedgem.py

The paper: FedGEM infers the global number of clusters, performs comparably to
centralised EM and outperforms existing federated clustering methods (k-FED here).
"""

import ml_collections

from moejax.studies import scoring
from moejax.studies.spec import grid


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "fedgem"
  c.description = (
    "Each draw is one instance: K = 8 isotropic unit-variance Gaussians in 2 dimensions "
    "whose means are rescaled so that the closest two are `separation` apart (in "
    "cluster stds); 5 clients each hold 100 points of each of 3-4 of the clusters "
    "(every cluster held by some client), the setting the paper names (8 clusters, 5 "
    "clients holding 3-4 each). FedGEM finds K-hat; centralised EM and k-FED are given "
    "the true K. `ari`: adjusted Rand index with the true clusters; `k_hat_correct`: 1 "
    "when FedGEM's K-hat = 8 (Wilson intervals). Every comparison of two methods is paired by "
    "draw (the same instance): the claims, the tables and the figure give intervals of "
    "the per-draw differences. Ibrahim et al.: FedGEM infers K, is "
    "comparable to centralised EM and beats existing federated clustering methods."
  )
  c.scorer = "fedgem"
  c.settings = scoring.defaults_with(c.scorer)
  c.arms = [
    {"name": "fedgem", "method": "fedgem"},
    {"name": "fedgem_pooled", "method": "fedgem_pooled"},
    {"name": "central_em", "method": "central_em"},
    {"name": "kfed", "method": "kfed"},
  ]
  c.levels = grid(("separation", [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0]))
  c.draws = 50
  c.reference = "fedgem"
  c.claims = [
    {
      "arm": "fedgem",
      "metric": "k_hat_correct",
      "interval": "wilson",
      "null": 0.8,
      "expect": "higher",
      "source": "ours",
      "text": "FedGEM finds the number of clusters (P(K-hat = K) > 0.8)",
    },
    {
      "arm": "fedgem",
      "reference": "central_em",
      "metric": "ari",
      "expect": None,
      "text": "FedGEM clusters comparably to centralised EM",
    },
    {
      "arm": "fedgem",
      "reference": "kfed",
      "metric": "ari",
      "expect": "higher",
      "text": "FedGEM clusters better than k-FED",
    },
    {
      "arm": "fedgem_pooled",
      "reference": "fedgem",
      "metric": "ari",
      "expect": None,
      "source": "ours",
      "text": "the pooled server step against the paper's (a diagnostic)",
    },
  ]
  return c
