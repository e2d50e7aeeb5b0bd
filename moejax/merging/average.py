"""Weight averaging (model soups, Wortsman et al., arXiv 2203.05482):

    theta = sum_i w_i theta_i,   w on the simplex (uniform 1/n by default)

No base is read. Step's expert merge (moejax/merging/experts.py) is this method
applied to the slices of one layer's expert stack, weighted by routing mass.
"""

from moejax.merging.base import map_leaves, register_merge, weighted_sum


@register_merge("average", needs_base=False, simplex=True)
def average(base, models, weights, settings):
  del base, settings
  return map_leaves(lambda _, ms: weighted_sum(weights, ms), None, models)
