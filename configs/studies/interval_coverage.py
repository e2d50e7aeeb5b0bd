r"""How often a 95% interval for a mean covers it: Student's t against the normal
approximation and the percentile bootstrap (moejax/studies/scorers/interval_coverage.py).

  python -m experiments.study --config=configs/studies/interval_coverage.py

The smallest study: one scorer, three arms, one level axis, claims with Wilson
intervals against a threshold and a paired t claim between arms.
"""

import ml_collections

from moejax.studies.spec import grid


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "interval_coverage"
  c.description = (
    "n values from N(0, 1) per draw; each arm's 95% interval for the mean; `covers` is 1 "
    "when it holds the true mean. Student (1908): the t interval covers 95% at every n; "
    "the normal approximation under-covers at small n."
  )
  c.scorer = "interval_coverage"
  c.settings = {"mu": 0.0, "sigma": 1.0, "seed": 0, "resamples": 500}
  c.arms = [
    {"name": "t", "interval": "t"},
    {"name": "normal", "interval": "normal"},
    {"name": "bootstrap", "interval": "bootstrap"},
  ]
  c.levels = grid(("n", [3, 5, 10, 30]))
  c.draws = 400
  c.reference = "t"
  c.claims = [
    {
      "arm": "t",
      "metric": "covers",
      "interval": "wilson",
      "null": 0.95,
      "expect": None,
      "text": "the t interval covers 95%",
    },
    {
      "arm": "normal",
      "metric": "covers",
      "interval": "wilson",
      "null": 0.95,
      "expect": "lower",
      "at": {"n": 3},
      "text": "the normal approximation under-covers",
    },
    {
      "arm": "normal",
      "reference": "t",
      "metric": "width",
      "expect": "lower",
      "source": "ours",
      "text": "the normal interval is narrower than the t interval",
    },
  ]
  return c
