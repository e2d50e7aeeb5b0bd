"""Every pruning method by name, without importing jax (for early flag checks):
expert methods choose whole experts per layer (posttrain/expert_subset.py), atom
methods rank the hidden units of all experts together (posttrain/atoms.py), each
by the atom score named here."""

from moejax.posttrain.expert_subset import METHODS as EXPERT_METHODS

ATOM_METHODS = {
  "heapr": "heapr",
  "heapr_first_order": "heapr_first_order",
  "atom_magnitude": "magnitude",
  "atom_random": "random",
}
METHODS = EXPERT_METHODS + tuple(ATOM_METHODS)
