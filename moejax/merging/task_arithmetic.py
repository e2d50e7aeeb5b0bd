"""Task arithmetic (Ilharco et al., arXiv 2212.04089, eq. 1; the merging baseline of
arXiv 2506.14126 and MergeMix, arXiv 2601.17858):

    theta = base + scale * sum_i w_i (theta_i - base)

Weights are any finite numbers (a negative one subtracts a task vector, the paper's
negation); uniform 1/n by default, so scale=n gives the paper's plain sum. With
one-hot weights and scale 1 it returns that model exactly.
"""

from moejax.merging.base import finite_number, map_leaves, register_merge, weighted_sum


def _validate(settings: dict) -> None:
  finite_number(settings, "scale", low=0.0, low_open=True)


@register_merge("task_arithmetic", settings={"scale": 1.0}, validate=_validate)
def task_arithmetic(base, models, weights, settings):
  scale = float(settings["scale"])
  return map_leaves(
    lambda b, ms: b + scale * weighted_sum(weights, [m - b for m in ms]), base, models
  )
