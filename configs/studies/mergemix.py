r"""MergeMix (arXiv 2601.17858): the merge of K domain experts as a proxy for training
on the data mixture of its weights, tested against mixtures actually trained, on
zoo-xs and four domains of the mix corpus (moejax/studies/scorers/mergemix.py,
moejax/merging/mergemix.py).

  python -m experiments.train --config=configs/zoo.py:model=xs --workdir=runs/zoo/xs
  python -m experiments.study --config=configs/studies/mergemix.py

The base is zoo-xs's checkpoint at step 120 (20% of its 600 steps), and the sizes
below are small, for a shared 2-core CPU machine (the run times are in provenance.json).
"""

import ml_collections

from moejax.studies.scorers.mergemix import ARMS
from moejax.studies.spec import grid

DOMAINS = ["drama", "code", "facts"]
TARGETS = ["mean", "prose"]


def claims():
  def rho_above(null, source, text):
    return {
      "arm": "proxy",
      "metric": "spearman",
      "null": null,
      "expect": "higher",
      "source": source,
      "text": text,
    }

  return [
    rho_above(
      0.8, "spec", "the proxy ranks the trained mixtures: Spearman rho > 0.8 (our spec's bar)"
    ),
    rho_above(0.9, "paper", "rho > 0.9 (the paper's value at 8B/16B)"),
    {
      "arm": "proxy_best",
      "reference": "uniform",
      "metric": "loss",
      "expect": "lower",
      "source": "paper",
      "text": "trained on the proxy's best weights beats the uniform mixture",
    },
    {
      "arm": "proxy_best",
      "reference": "best_trained",
      "metric": "loss",
      "expect": None,
      "source": "ours",
      "text": "alpha* trained, against the best of the trained mixtures",
    },
  ]


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "mergemix"
  c.description = (
    "MergeMix: K=3 domain experts (drama, code, facts of the mix corpus) each "
    "fine-tuned from zoo-xs (its step-120 checkpoint) for 12 steps of 4 windows of 64 "
    "bytes at a constant learning rate 1e-3 (4 warmup steps); theta(alpha) = base + "
    "sum_k alpha_k (theta_k - base) scored on held-out windows stands in for training "
    "on the mixture alpha. Reality: 12 mixtures (uniform, then 11 Dirichlet(1) draws) "
    "trained the same 12 steps from the same base, each row of a batch given to a "
    "domain by smooth weighted round robin, so a one-hot mixture is exactly its expert. "
    "rho: Spearman between the proxy's and the trained models' held-out losses over the "
    "12 mixtures (test windows). alpha*: the best of the 10 points of the simplex grid "
    "of step 1/3 by the proxy's loss on the selection windows, then trained. Targets: "
    "the mean loss over the three domains, and prose, a domain outside the mixture. "
    "Held-out: the first 1 KiB of each domain's validation documents (15 windows), even "
    "windows for selection, odd ones for the test. Draw d: the seed of the batches, the "
    "step keys and the mixtures."
  )
  c.scorer = "mergemix"
  c.settings = {
    "workdir": "runs/zoo/xs",
    "step": 120,
    "domains": DOMAINS,
    "steps": 12,
    "batch": 4,
    "learning_rate": 1e-3,
    "warmup": 4,
    "mixtures": 12,
    "resolution": 3,
    "bytes_per_domain": 1024,
    "seq_len": 64,
  }
  c.arms = [{"name": n} for n in ARMS]
  c.levels = grid(("target", TARGETS))
  c.draws = 5
  c.reference = "uniform"
  c.claims = claims()
  return c
